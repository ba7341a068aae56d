"""Frame PNGs in file storage, addressed by sha256: identical images are stored once."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from django.core.files.base import ContentFile
from django.core.files.storage import Storage, default_storage

# Directories known to exist, per process: frames fan out over 65,536 of them, and asking the
# file system again for each new frame costs a system call.
_KNOWN_DIRS: set[Path] = set()


def frame_name(sha256: str) -> str:
    return f"frames/{sha256[:2]}/{sha256[2:4]}/{sha256}.png"


class FrameStore:
    """Writes each distinct PNG once; remembers what it has written in this process.

    `put` writes at once. `stage` only names the file and queues the bytes, so that a caller
    can write a whole chunk later, off its hot loop (`take_staged` then `write_many`), before
    it commits the rows that name those files.
    """

    def __init__(self, storage: Storage | None = None) -> None:
        self.storage = storage or default_storage
        self._known: set[str] = set()
        self._staged: list[tuple[str, bytes]] = []
        try:
            self._root: Path | None = Path(self.storage.path(""))
        except NotImplementedError:  # remote storage (S3): no local path
            self._root = None
        self._root_prefix = os.path.join(self._root, "") if self._root is not None else ""

    def put(self, png: bytes) -> tuple[str, str]:
        """Store `png` if new; return (sha256, storage name)."""
        sha256, name = self.stage(png)
        self.write_many(self.take_staged())
        return sha256, name

    def stage(self, png: bytes) -> tuple[str, str]:
        sha256 = hashlib.sha256(png).hexdigest()
        name = frame_name(sha256)
        if sha256 not in self._known:
            self._known.add(sha256)
            self._staged.append((name, png))
        return sha256, name

    def take_staged(self) -> list[tuple[str, bytes]]:
        staged, self._staged = self._staged, []
        return staged

    def stage_again(self, files: list[tuple[str, bytes]]) -> None:
        """Put files taken by `take_staged` back in front, to be written with their rows."""
        self._staged = list(files) + self._staged

    def write_many(self, files: list[tuple[str, bytes]]) -> None:
        for name, png in files:
            self._write(name, png)

    def _write(self, name: str, png: bytes) -> None:
        if self._root is None:
            if not self.storage.exists(name):
                self.storage.save(name, ContentFile(png))
            return
        path = self._root / name
        if path.exists():
            return
        if path.parent not in _KNOWN_DIRS:
            path.parent.mkdir(parents=True, exist_ok=True)
            _KNOWN_DIRS.add(path.parent)
        # Write then rename: two workers storing the same frame never leave a torn file.
        try:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        except FileNotFoundError:  # removed since we made it
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o644)
            fh.write(png)
        os.replace(tmp, path)

    def read(self, name: str) -> bytes:
        if self._root is not None:
            # A plain path string: an export reads a frame per row, and Path cost more than
            # the read itself.
            with open(self._root_prefix + name, "rb", buffering=0) as fh:
                return fh.readall()
        with self.storage.open(name, "rb") as fh:
            return fh.read()
