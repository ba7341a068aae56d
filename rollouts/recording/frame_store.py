"""Frame PNGs in file storage, addressed by sha256: identical images are stored once."""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from django.core.files.base import ContentFile
from django.core.files.storage import Storage, default_storage

# Directories known to exist, per process: frames fan out over 65,536 of them, and asking the
# file system again for each new frame costs a system call.
_KNOWN_DIRS: set[str] = set()
# A file of our own: created here, never an existing one.
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
# Names this process's temporary files apart from those of other hosts' processes.
_WRITER_TOKEN = os.urandom(4).hex()
# How much nicer than its process the thread writing frames ahead is: see `_frame_writer`.
WRITE_AHEAD_NICE = 10

# A staged frame: (storage name, PNG bytes, its write ahead if one was started).
Staged = tuple[str, bytes, "Future[None] | None"]


def frame_name(sha256: str) -> str:
    return f"frames/{sha256[:2]}/{sha256[2:4]}/{sha256}.png"


class FrameStore:
    """Writes each distinct PNG once; remembers what it has written in this process.

    `put` writes at once. `stage` only names the file and queues the bytes, so that a caller
    can write a whole chunk later, off its hot loop (`take_staged` then `write_many`), before
    it commits the rows that name those files.

    `write_ahead` (the recorder's): `stage` also starts writing the file at once, on the
    process's frame writer (`_frame_writer`), while the episode waits for its model;
    `write_many` then only waits for what that thread has begun and writes the rest itself.
    So an episode's files are not all written at its end, where a batch's episodes end
    together (creating files and their directories is slow on a virtual disk), on the path
    to the batch's end.
    """

    def __init__(self, storage: Storage | None = None, *, write_ahead: bool = False) -> None:
        self.storage = storage or default_storage
        self._known: set[str] = set()
        self._staged: list[Staged] = []
        try:
            self._root: Path | None = Path(self.storage.path(""))
        except NotImplementedError:  # remote storage (S3): no local path
            self._root = None
        self._root_prefix = os.path.join(self._root, "") if self._root is not None else ""
        self._bucket = _BucketObjects.of(self.storage) if self._root is None else None
        # Local files, or a bucket through a client of each thread's own: another remote
        # storage's client may not be shared across threads.
        self._write_ahead = write_ahead and (self._root is not None or self._bucket is not None)

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
            ahead = _frame_writer().submit(self._write, name, png) if self._write_ahead else None
            self._staged.append((name, png, ahead))
        return sha256, name

    def take_staged(self) -> list[Staged]:
        staged, self._staged = self._staged, []
        return staged

    def discard_staged(self) -> None:
        """Forget the staged files: those not begun are not written (one begun may finish:
        a file without rows, as a chunk rolled back leaves)."""
        for _, _, ahead in self.take_staged():
            if ahead is not None:
                ahead.cancel()

    def stage_again(self, files: list[Staged]) -> None:
        """Put files taken by `take_staged` back in front, to be written with their rows."""
        self._staged = list(files) + self._staged

    def write_many(self, files: list[Staged]) -> None:
        """Write the files (each whole once this returns), or raise."""
        for name, png, ahead in files:
            # Written ahead: done, or wait for it. Not begun yet: written here, rather than
            # after whatever the writer has queued before it. Failed: tried again here.
            if ahead is not None and not ahead.cancel() and ahead.exception() is None:
                continue
            self._write(name, png)

    def _write(self, name: str, png: bytes) -> None:
        if self._bucket is not None:
            self._bucket.put(name, png)
            return
        if self._root is None:
            if not self.storage.exists(name):
                self.storage.save(name, ContentFile(png))
            return
        # Plain strings and system calls: nearly every recorded step writes a new frame, and
        # pathlib and tempfile would add their Python to each (and to finding one already
        # stored).
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
        """The frame's bytes; FrameMissing when storage has no such file."""
        try:
            if self._root is not None:
                # A plain path string: an export reads a frame per row, and Path cost more
                # than the read itself.
                with open(self._root_prefix + name, "rb", buffering=0) as fh:
                    return fh.readall()
            if self._bucket is not None:
                return self._bucket.get(name)
            with self.storage.open(name, "rb") as fh:
                return fh.read()
        except FileNotFoundError as exc:
            raise FrameMissing(name) from exc
        except OSError as exc:  # a disk that failed the read: the file may well be there
            raise FrameUnreadable(name) from exc


class FrameUnreadable(OSError):
    """Storage did not answer for a frame it may well hold (a bucket out of reach, a disk
    error): said with the frame's storage name, not the client's words; worth trying again."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"frame storage did not answer for {name}; try again in a moment")


class FrameMissing(FileNotFoundError):
    """A frame's row names a file that storage (a folder or a bucket) does not hold: said
    with the frame's storage name, never a host's path or the storage client's words."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"frame file missing from storage: {name}")


class _BucketObjects:
    """A frame as one GET or one PUT on an S3 bucket (django-storages' S3Storage), where the
    storage API makes two or three requests and a temporary file of each: an export from a
    bucket reads a frame per row, and a worker writes one per step.

    A PUT replaces whatever the name held with the same bytes (the name is their sha256), so
    no existence check is needed first. The client is the storage's own for this thread."""

    def __init__(self, storage: Storage) -> None:
        from storages.utils import clean_name

        self.storage: Any = storage
        self._clean = clean_name

    @classmethod
    def of(cls, storage: Storage) -> _BucketObjects | None:
        wanted = ("bucket_name", "connection", "get_object_parameters", "_normalize_name")
        return cls(storage) if all(hasattr(storage, a) for a in wanted) else None

    def _call(self, name: str) -> tuple[Any, dict[str, str]]:
        key = self.storage._normalize_name(self._clean(name))
        return self.storage.connection.meta.client, {
            "Bucket": self.storage.bucket_name,
            "Key": key,
        }

    def get(self, name: str) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        client, where = self._call(name)
        try:
            return client.get_object(**where)["Body"].read()
        except client.exceptions.NoSuchKey as exc:
            raise FrameMissing(name) from exc
        except (BotoCoreError, ClientError) as exc:  # unreachable, refused, throttled
            raise FrameUnreadable(name) from exc

    def put(self, name: str, png: bytes) -> None:
        client, where = self._call(name)
        params = {"ContentType": "image/png", **self.storage.get_object_parameters(name)}
        if getattr(self.storage, "default_acl", None):
            params["ACL"] = self.storage.default_acl
        client.put_object(Body=png, **where, **params)


_writer_lock = threading.Lock()
_writer: ThreadPoolExecutor | None = None


def _frame_writer() -> ThreadPoolExecutor:
    """The process's one thread writing frames ahead, started at its first frame.

    On Linux it runs at a lower priority (`WRITE_AHEAD_NICE` above its process's): the files
    are needed only when the episode's rows are written, and a batch's episodes all start at
    once, each needing the cores for its world and first request before its first call can
    leave.
    """
    global _writer
    with _writer_lock:
        if _writer is None:
            _writer = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="frame-writer", initializer=_lower_priority
            )
        return _writer


def _forget_writer() -> None:
    # A forked child (Celery's prefork pool) has no such thread, and perhaps a lock held by
    # a thread that does not exist in it either.
    global _writer, _writer_lock
    _writer_lock = threading.Lock()
    _writer = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_writer)


def _lower_priority() -> None:
    # On Linux, PRIO_PROCESS with a thread id sets that thread alone (elsewhere it would set
    # the whole process: not wanted). Where it is not allowed, the thread keeps its
    # process's priority.
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            thread = threading.get_native_id()
            nice = os.getpriority(os.PRIO_PROCESS, thread)  # the process's, inherited
            os.setpriority(os.PRIO_PROCESS, thread, min(19, nice + WRITE_AHEAD_NICE))
