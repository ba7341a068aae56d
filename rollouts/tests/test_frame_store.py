"""Frame files: written whole, readable by the web server, once per image, whatever races."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import threading
from pathlib import Path

from django.core.files.storage import FileSystemStorage

from rollouts.frame_store import FrameStore


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


def test_threads_storing_the_same_frames_at_once_leave_every_file_whole(tmp_path):
    images = [os.urandom(500 + 37 * i) for i in range(150)]
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def write() -> None:
        store = _store(tmp_path)  # a store per episode, as the recorder has
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
