"""The HTTP transport of model calls: answers are read in bounded memory and bounded time.

A model server is outside our control. The client library reads a whole body into memory,
error bodies included, and decompresses it as it likes: a 200 MB answer took a worker to
1.45 GB. Here (a response hook of the library's own HTTP client, so proxies are covered too)
every body is read through a stream that stops at `max_bytes` of decoded
content (gzip and deflate are decoded here, with the same bound, so a small compressed body
cannot expand without limit) and at a wall-clock deadline (a server dripping one byte a
second never trips a read timeout).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterator

import httpx2
import openai

from rollouts.policies.openai.plain_http import plain_http_mounts

# What we decode ourselves, so that the decoded size is bounded while it is produced.
ACCEPT_ENCODING = "gzip, deflate"


class AnswerTooLarge(Exception):
    """The server sent more than the cap; the rest was not read."""

    def __init__(self, *, status: int, max_bytes: int) -> None:
        super().__init__(f"HTTP {status}: the answer is over {max_bytes} bytes; not read further")
        self.status = status
        self.max_bytes = max_bytes


class UnreadableAnswer(Exception):
    """The body cannot be decoded (an encoding we did not ask for, a corrupt stream)."""


class _BoundedStream(httpx2.SyncByteStream):
    def __init__(
        self,
        inner: httpx2.SyncByteStream,
        *,
        status: int,
        encoding: str,
        max_bytes: int,
        deadline: float,
    ) -> None:
        self._inner = inner
        self._status = status
        self._max_bytes = max_bytes
        self._deadline = deadline
        self._decoder = None
        if encoding in ("gzip", "x-gzip"):
            self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._decoder = zlib.decompressobj(zlib.MAX_WBITS)
        elif encoding not in ("", "identity"):
            raise UnreadableAnswer(
                f"HTTP {status}: content encoding {encoding[:40]!r} not asked for"
            )

    def __iter__(self) -> Iterator[bytes]:
        produced = 0
        for raw in self._inner:
            if time.monotonic() > self._deadline:
                raise httpx2.ReadTimeout("the answer took longer than the request timeout")
            chunks = [raw] if self._decoder is None else self._decode(raw, produced)
            for chunk in chunks:
                produced += len(chunk)
                if produced > self._max_bytes:
                    raise AnswerTooLarge(status=self._status, max_bytes=self._max_bytes)
                yield chunk
        if self._decoder is not None:
            tail = self._decoder.flush()
            if produced + len(tail) > self._max_bytes:
                raise AnswerTooLarge(status=self._status, max_bytes=self._max_bytes)
            if tail:
                yield tail

    def _decode(self, raw: bytes, produced: int) -> list[bytes]:
        # One byte more than is left: enough to know the cap is passed, never more.
        room = self._max_bytes - produced + 1
        try:
            out = self._decoder.decompress(raw, room)
        except zlib.error as exc:
            raise UnreadableAnswer(f"HTTP {self._status}: corrupt compressed body") from exc
        if self._decoder.unconsumed_tail:
            raise AnswerTooLarge(status=self._status, max_bytes=self._max_bytes)
        return [out]

    def close(self) -> None:
        self._inner.close()


def bounded_http_client(*, max_bytes: int, timeout: float) -> httpx2.Client:
    """The client library's HTTP client, its bodies bounded whatever transport (or proxy)."""
    return openai.DefaultHttpxClient(
        event_hooks={"response": [bounded_body_hook(max_bytes=max_bytes, timeout=timeout)]},
        # Plain-HTTP endpoints (a vLLM server on the network) over the standard library's
        # HTTP client: a third of the CPU per call (`plain_http`).
        mounts=plain_http_mounts(),
        # The key goes to the endpoint's URL, never on to where it redirects.
        follow_redirects=False,
    )


def bounded_body_hook(*, max_bytes: int, timeout: float):
    """A response hook that reads each body in at most `max_bytes` (decoded) and `timeout`."""

    def bound(response: httpx2.Response) -> None:
        # Runs on each response before any of its body is read.
        encoding = response.headers.get("content-encoding", "").strip().lower()
        try:
            stream = _BoundedStream(
                response.stream,
                status=response.status_code,
                encoding=encoding,
                max_bytes=max_bytes,
                deadline=time.monotonic() + timeout,
            )
        except UnreadableAnswer:
            response.close()
            raise
        # Decoded here: the client must not decode it a second time.
        response.headers.pop("content-encoding", None)
        response.stream = stream

    return bound
