"""Frames read ahead of the rows: the next chunk's PNGs are read by a few threads while this
chunk's rows are built.

A frame read waits on the disk or the network (S3), not on the CPU: measured here, cold PNG
files read one after another came at ~10,000 a second (100 us each, a third of a row's
time in a million-row export) and at ~36,000 a second from 8 threads. Reads go in groups,
so a warm read (7 us) does not pay a thread hand-off each. Memory holds two chunks' frames
at most: what a chunk left unread (rows whose image was already built) is dropped when the
chunk after it starts.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor

from rollouts.recording.frame_store import FrameStore

THREADS = 4
GROUP = 64

_Read = dict[str, bytes | Exception]


class FramesAhead:
    """`read(name)` as `FrameStore.read`, served from reads started by `ahead(names)`."""

    def __init__(self, store: FrameStore, *, threads: int = THREADS, group: int = GROUP) -> None:
        self.store = store
        self.group = group
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="frames-ahead")
        self._current: dict[str, Future[_Read]] = {}
        self._next: dict[str, Future[_Read]] = {}

    def ahead(self, names: Iterable[str]) -> None:
        """Start reading `names` (the next chunk's frames); the chunk read ahead last time
        becomes the current one, and the one before it is forgotten."""
        self._current = self._next
        self._next = {}
        pending = list(dict.fromkeys(n for n in names if n not in self._current))
        for start in range(0, len(pending), self.group):
            names_in_group = pending[start : start + self.group]
            future = self._pool.submit(self._read_group, names_in_group)
            for name in names_in_group:
                self._next[name] = future

    def read(self, name: str) -> bytes:
        future = self._current.get(name) or self._next.get(name)
        if future is None:
            return self.store.read(name)
        data = future.result()[name]
        if isinstance(data, Exception):
            raise data  # where the row reads it, as a read of its own would have
        return data

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._current, self._next = {}, {}

    def _read_group(self, names: list[str]) -> _Read:
        read: _Read = {}
        for name in names:
            try:
                read[name] = self.store.read(name)
            except Exception as exc:  # one missing frame is that row's error, not the group's
                read[name] = exc
        return read
