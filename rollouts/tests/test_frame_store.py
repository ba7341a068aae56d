"""Frame files: written whole, readable by the web server, once per image, whatever races."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import sys
import threading
from pathlib import Path

import pytest
from django.core.files.storage import FileSystemStorage

from rollouts.recording import frame_store
from rollouts.recording.frame_store import FrameStore


def _store(tmp_path: Path) -> FrameStore:
    return FrameStore(FileSystemStorage(location=tmp_path))


def _leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and p.name.startswith(".tmp-")]


def test_it_writes_each_image_whole_under_its_sha256_readable_by_all(tmp_path):
    png = b"\x89PNG\r\n\x1a\n" + os.urandom(3000)
    sha = hashlib.sha256(png).hexdigest()
    old_umask = os.umask(0o077)  # a worker started with a strict umask
    try:
        got_sha, name = _store(tmp_path).put(png)
    finally:
        os.umask(old_umask)
    assert got_sha == sha
    assert name == f"frames/{sha[:2]}/{sha[2:4]}/{sha}.png"
    path = tmp_path / name
    assert path.read_bytes() == png
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("write_ahead", [False, True])
def test_threads_storing_the_same_frames_at_once_leave_every_file_whole(tmp_path, write_ahead):
    images = [os.urandom(500 + 37 * i) for i in range(150)]
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def write() -> None:
        # A store per episode, as the recorder has (its own writes ahead).
        store = FrameStore(FileSystemStorage(location=tmp_path), write_ahead=write_ahead)
        start.wait()
        try:
            for png in images:
                store.stage(png)
            store.write_many(store.take_staged())
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for png in images:
        sha = hashlib.sha256(png).hexdigest()
        assert (tmp_path / f"frames/{sha[:2]}/{sha[2:4]}/{sha}.png").read_bytes() == png
    assert len([p for p in (tmp_path / "frames").rglob("*.png")]) == len(images)
    assert _leftovers(tmp_path) == []


def test_it_writes_again_into_a_directory_removed_behind_its_back(tmp_path):
    png = b"a frame"
    _, name = _store(tmp_path).put(png)
    # An operator cleans up; this process still remembers the directory as made.
    shutil.rmtree(tmp_path / "frames")
    _, again = _store(tmp_path).put(png)  # another episode's store, the same image
    assert again == name
    assert (tmp_path / name).read_bytes() == png


def _ahead_store(tmp_path: Path) -> FrameStore:
    return FrameStore(FileSystemStorage(location=tmp_path), write_ahead=True)


def _writer_done() -> None:
    """Wait until the frame writer has done everything queued so far (one thread, in order)."""
    frame_store._frame_writer().submit(lambda: None).result(timeout=10)


def test_a_store_writing_ahead_writes_each_frame_before_it_is_asked_to(tmp_path):
    store = _ahead_store(tmp_path)
    png = os.urandom(800)
    _, name = store.stage(png)
    _writer_done()
    assert (tmp_path / name).read_bytes() == png  # no write_many yet
    store.write_many(store.take_staged())
    assert (tmp_path / name).read_bytes() == png
    assert _leftovers(tmp_path) == []


def test_a_frame_the_writer_has_not_begun_is_written_by_the_caller(tmp_path):
    gate = threading.Event()
    blocked = frame_store._frame_writer().submit(gate.wait, 10)  # the writer is busy
    try:
        store = _ahead_store(tmp_path)
        png = os.urandom(800)
        _, name = store.stage(png)
        store.write_many(store.take_staged())  # does not wait behind the writer's queue
        assert (tmp_path / name).read_bytes() == png
        assert not blocked.done()
    finally:
        gate.set()
    blocked.result(timeout=10)
    _writer_done()
    assert (tmp_path / name).read_bytes() == png
    assert _leftovers(tmp_path) == []


def test_a_frame_that_cannot_be_written_ahead_fails_its_chunk_or_is_written_again(tmp_path):
    (tmp_path / "frames").write_bytes(b"")  # a file where the frames' directory goes
    store = _ahead_store(tmp_path)
    png = os.urandom(800)
    _, name = store.stage(png)
    _writer_done()  # the write ahead has failed
    staged = store.take_staged()
    with pytest.raises(OSError):
        store.write_many(staged)
    (tmp_path / "frames").unlink()
    store.write_many(staged)  # the rows' next attempt writes the file itself
    assert (tmp_path / name).read_bytes() == png


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priority: Linux")
def test_the_frame_writer_runs_at_a_lower_priority_than_its_process():
    thread = frame_store._frame_writer().submit(threading.get_native_id).result(timeout=10)
    process = os.getpriority(os.PRIO_PROCESS, 0)
    expected = min(19, process + frame_store.WRITE_AHEAD_NICE)
    assert os.getpriority(os.PRIO_PROCESS, thread) == expected


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_writes_ahead_on_a_writer_of_its_own(tmp_path):
    frame_store._frame_writer()  # the parent's, with its thread
    png = os.urandom(800)
    pid = os.fork()
    if pid == 0:  # the child: the parent's writer thread does not exist here
        code = 1
        try:
            store = _ahead_store(tmp_path)
            _, name = store.stage(png)
            store.write_many(store.take_staged())
            code = 0 if (tmp_path / name).read_bytes() == png else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_discarded_frames_the_writer_has_not_begun_are_never_written(tmp_path):
    gate = threading.Event()
    blocked = frame_store._frame_writer().submit(gate.wait, 10)
    try:
        store = _ahead_store(tmp_path)
        _, name = store.stage(os.urandom(800))
        store.discard_staged()  # a replay that diverged: nothing of it is kept
    finally:
        gate.set()
    blocked.result(timeout=10)
    _writer_done()
    assert not (tmp_path / name).exists()
    assert store.take_staged() == []
