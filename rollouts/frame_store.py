"""Frame PNGs in file storage, addressed by sha256: identical images are stored once."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from django.core.files.base import ContentFile
from django.core.files.storage import Storage, default_storage


def frame_name(sha256: str) -> str:
    return f"frames/{sha256[:2]}/{sha256[2:4]}/{sha256}.png"


class FrameStore:
    """Writes each distinct PNG once; remembers what it has written in this process."""

    def __init__(self, storage: Storage | None = None) -> None:
        self.storage = storage or default_storage
        self._known: set[str] = set()
        try:
            self._root: Path | None = Path(self.storage.path(""))
        except NotImplementedError:  # remote storage (S3): no local path
            self._root = None

    def put(self, png: bytes) -> tuple[str, str]:
        """Store `png` if new; return (sha256, storage name)."""
        sha256 = hashlib.sha256(png).hexdigest()
        name = frame_name(sha256)
        if sha256 not in self._known:
            if self._root is not None:
                self._write_local(self._root / name, png)
            elif not self.storage.exists(name):
                self.storage.save(name, ContentFile(png))
            self._known.add(sha256)
        return sha256, name

    @staticmethod
    def _write_local(path: Path, png: bytes) -> None:
        if path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write then rename: two workers storing the same frame never leave a torn file.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(png)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)

    def read(self, name: str) -> bytes:
        if self._root is not None:
            return (self._root / name).read_bytes()
        with self.storage.open(name, "rb") as fh:
            return fh.read()
