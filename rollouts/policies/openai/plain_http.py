"""Plain-HTTP model calls over the standard library's HTTP/1.1 client: the same bytes, less CPU.

A threaded worker overlaps 16 episodes' model calls on one core, so what a call costs the
worker's CPU decides how many overlap. The client library's default transport (httpcore
and h11) parses and checks HTTP/1.1 in Python, and was most of a call's CPU; `http.client`
parses the same exchange mostly in C (figures: docs/benchmarks.md).

It carries plain `http://` only, on one kept-alive connection per thread and server (a
threaded worker's threads each play one episode at a time), and only where the
environment names no proxy (`plain_http_mounts`): HTTPS and proxies stay with the client
library's own transport. What goes on the wire is the request the library built, headers
as it set them; the answer comes back raw (still compressed, if it was), for the bounded
stream of `transport` to read. Faults are the library's own exceptions, as its default
transport raises them, so the client maps them to the same `openai` errors.
"""

from __future__ import annotations

import http.client
import re
import socket
import threading
from collections.abc import Iterator
from urllib.request import getproxies

import httpx2

CHUNK_BYTES = 65536
# RFC 9110 token characters for a field name; a value may hold neither CR, LF nor NUL (no
# header injection, whatever a key or a model name holds).
_FIELD_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FORBIDDEN_IN_VALUE = re.compile(rb"[\r\n\x00]")


def plain_http_mounts() -> dict[str, httpx2.BaseTransport]:
    """`mounts` for the client library's HTTP client: this transport for plain HTTP, when no
    proxy is configured (a mount would otherwise take the place of the proxy's)."""
    if any(value for name, value in getproxies().items() if name != "no"):
        return {}
    return {"http://": PlainHttpTransport()}


class PlainHttpTransport(httpx2.BaseTransport):
    def __init__(self) -> None:
        self._local = threading.local()

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        if url.scheme != "http":
            raise httpx2.UnsupportedProtocol(f"plain HTTP only, not {url.scheme!r}")
        origin = (url.host, url.port or 80)
        timeouts = request.extensions.get("timeout", {})
        head = _request_head(request)
        body = request.read()
        sock = self._idle().pop(origin, None)
        if sock is None or not _still_open(sock):
            if sock is not None:
                sock.close()
            sock = _connect(origin, timeouts.get("connect"), request)
        try:
            sock.settimeout(timeouts.get("write"))
            if len(body) < CHUNK_BYTES:
                sock.sendall(head + body)  # a request of a few KB in one segment
            else:
                sock.sendall(head)
                sock.sendall(body)  # a large body is not copied onto its head
        except TimeoutError as exc:
            sock.close()
            raise httpx2.WriteTimeout(str(exc) or "timed out", request=request) from exc
        except OSError as exc:
            sock.close()
            raise httpx2.WriteError(str(exc), request=request) from exc
        response = http.client.HTTPResponse(sock, method=request.method)
        try:
            sock.settimeout(timeouts.get("read"))
            response.begin()
        except BaseException as exc:
            response.close()
            sock.close()
            if not isinstance(exc, Exception):
                raise
            raise _read_error(exc, request) from exc
        headers = [
            (name.encode("latin-1"), value.encode("latin-1"))
            for name, value in response.msg.items()
        ]
        return httpx2.Response(
            response.status,
            headers=headers,
            stream=_Body(self, origin, sock, response, request),
            extensions={
                "http_version": b"HTTP/1.1" if response.version == 11 else b"HTTP/1.0",
                "reason_phrase": response.reason.encode("latin-1", errors="replace"),
            },
        )

    def close(self) -> None:
        for sock in self._idle().values():
            sock.close()
        self._idle().clear()

    def _idle(self) -> dict[tuple[str, int], socket.socket]:
        idle = getattr(self._local, "idle", None)
        if idle is None:
            idle = self._local.idle = {}
        return idle

    def _keep(self, origin: tuple[str, int], sock: socket.socket) -> None:
        previous = self._idle().get(origin)
        if previous is not None:
            previous.close()
        self._idle()[origin] = sock


class _Body(httpx2.SyncByteStream):
    """The answer's body as the server sent it; the connection is kept once it is read whole."""

    def __init__(
        self,
        transport: PlainHttpTransport,
        origin: tuple[str, int],
        sock: socket.socket,
        response: http.client.HTTPResponse,
        request: httpx2.Request,
    ) -> None:
        self._transport = transport
        self._origin = origin
        self._sock = sock
        self._response = response
        self._request = request
        self._whole = False
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        try:
            while chunk := self._response.read(CHUNK_BYTES):
                yield chunk
        except Exception as exc:
            raise _read_error(exc, self._request) from exc
        self._whole = True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        reusable = self._whole and not self._response.will_close
        self._response.close()
        if reusable:
            self._transport._keep(self._origin, self._sock)
        else:
            # Unread bytes (an answer cut at the cap) would be read as the next answer.
            self._sock.close()


def _request_head(request: httpx2.Request) -> bytes:
    target = request.url.raw_path
    lines = [request.method.encode("ascii") + b" " + target + b" HTTP/1.1"]
    for name, value in request.headers.raw:
        if not _FIELD_NAME.fullmatch(name) or _FORBIDDEN_IN_VALUE.search(value):
            raise httpx2.LocalProtocolError(f"illegal header {name[:40]!r}", request=request)
        lines.append(name + b": " + value)
    if _FORBIDDEN_IN_VALUE.search(target) or b" " in target:
        raise httpx2.LocalProtocolError("illegal request target", request=request)
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _connect(
    origin: tuple[str, int], timeout: float | None, request: httpx2.Request
) -> socket.socket:
    try:
        sock = socket.create_connection(origin, timeout=timeout)
    except TimeoutError as exc:
        raise httpx2.ConnectTimeout(str(exc) or "timed out", request=request) from exc
    except OSError as exc:
        raise httpx2.ConnectError(str(exc), request=request) from exc
    # Header and body leave in one segment; an answer's next request must not wait for
    # an acknowledgement (Nagle's algorithm with delayed ACKs would hold each call back).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _still_open(sock: socket.socket) -> bool:
    """Whether an idle kept-alive connection can carry a request: the server has neither
    closed it nor sent anything unasked (one non-blocking peek, no wait)."""
    sock.settimeout(0.0)  # non-blocking: a socket with a timeout would wait for data
    try:
        sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False  # b"": the server closed it; bytes: something it was not asked for


def _read_error(exc: Exception, request: httpx2.Request) -> Exception:
    """The client library's exception for a fault while reading the answer."""
    if isinstance(exc, TimeoutError):
        return httpx2.ReadTimeout(str(exc) or "timed out", request=request)
    if isinstance(exc, http.client.HTTPException):
        # RemoteDisconnected, a bad status line, a header line too long, a short body.
        message = str(exc) or type(exc).__name__
        if isinstance(exc, http.client.RemoteDisconnected):
            message = "Server disconnected without sending a response."
        return httpx2.RemoteProtocolError(message, request=request)
    if isinstance(exc, OSError):
        return httpx2.ReadError(str(exc), request=request)
    return httpx2.RemoteProtocolError(f"unreadable answer: {exc}", request=request)
