"""Frame PNGs in file storage, addressed by sha256: identical images are stored once."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from django.core.files.base import ContentFile
from django.core.files.storage import Storage, default_storage

# Directories known to exist, per process: frames fan out over 65,536 of them, and asking the
# file system again for each new frame costs a system call.
_KNOWN_DIRS: set[str] = set()
# A file of our own: created here, never an existing one.
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
# Names this process's temporary files apart from those of other hosts' processes.
_WRITER_TOKEN = os.urandom(4).hex()


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
        # Plain strings and system calls: nearly every recorded step writes a new frame, and
        # pathlib and tempfile added ~40 us of Python to each (and doubled the cost of
        # finding one already stored).
        path = self._root_prefix + name
        if os.path.exists(path):
            return
        directory = os.path.dirname(path)
        if directory not in _KNOWN_DIRS:
            os.makedirs(directory, exist_ok=True)
            _KNOWN_DIRS.add(directory)
        # Write then rename: two workers storing the same frame never leave a torn file. The
        # temporary name is this process's and thread's own (a random token tells apart
        # processes of other hosts on shared storage); O_EXCL refuses a leftover.
        writer = f"{_WRITER_TOKEN}-{os.getpid()}-{threading.get_ident()}"
        tmp = f"{directory}/.tmp-{writer}-{os.path.basename(path)}"
        try:
            fd = os.open(tmp, _NEW_FILE, 0o644)
        except FileExistsError:  # left by a writer that died between open and rename
            os.unlink(tmp)
            fd = os.open(tmp, _NEW_FILE, 0o644)
        except FileNotFoundError:  # the directory was removed since we made it
            os.makedirs(directory, exist_ok=True)
            fd = os.open(tmp, _NEW_FILE, 0o644)
        try:
            os.fchmod(fd, 0o644)  # whatever the umask: the web server reads these
            view = memoryview(png)
            while view:
                view = view[os.write(fd, view) :]
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        os.replace(tmp, path)

    def read(self, name: str) -> bytes:
        if self._root is not None:
            # A plain path string: an export reads a frame per row, and Path cost more than
            # the read itself.
            with open(self._root_prefix + name, "rb", buffering=0) as fh:
                return fh.readall()
        with self.storage.open(name, "rb") as fh:
            return fh.read()
