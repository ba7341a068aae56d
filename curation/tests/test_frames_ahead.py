"""Frames read ahead of the export's rows: the same bytes, errors where the row reads, and
no more than two chunks kept."""

from __future__ import annotations

import pytest
from django.core.files.storage import FileSystemStorage

from curation.exporting.frames_ahead import FramesAhead
from rollouts.recording.frame_store import FrameStore


@pytest.fixture
def store(tmp_path) -> FrameStore:
    return FrameStore(FileSystemStorage(location=tmp_path))


def test_it_serves_what_it_read_ahead_and_forgets_it_two_chunks_later(store, tmp_path):
    pngs = [b"\x89PNG frame %d" % i for i in range(200)]  # more than one read group
    names = [store.put(png)[1] for png in pngs]
    frames = FramesAhead(store, threads=2, group=64)
    try:
        frames.ahead(names)
        frames.ahead([])  # the chunk read ahead is now the current one
        assert [frames.read(name) for name in names] == pngs  # each waits for its group
        for name in names:
            (tmp_path / name).unlink()
        # Read before the files went: served from memory again.
        assert [frames.read(name) for name in names] == pngs
        frames.ahead([])  # two chunks on: forgotten, read from the store (gone)
        with pytest.raises(FileNotFoundError):
            frames.read(names[5])
    finally:
        frames.close()


def test_a_missing_frame_fails_its_own_read_only(store, tmp_path):
    kept = store.put(b"\x89PNG kept")[1]
    gone = store.put(b"\x89PNG gone")[1]
    (tmp_path / gone).unlink()
    frames = FramesAhead(store, threads=1, group=64)
    try:
        frames.ahead([gone, kept])
        with pytest.raises(FileNotFoundError):
            frames.read(gone)
        assert frames.read(kept) == b"\x89PNG kept"
    finally:
        frames.close()
