"""How both training providers talk HTTP: no redirect is followed, every request has one
deadline for all of it, and no answer is read past a size.

- Redirects: a key goes to its endpoint's URL and nowhere else. A 3xx is an error (httpx
  drops `Authorization` on a redirect to another host, but not the body: the training file
  went along).
- Deadline: a read timeout bounds each read, so a server sending a byte every few seconds
  never trips it (one held a worker for 160 s). Here the request's timeout is the budget for
  the whole exchange, connect, upload, headers and body: every socket operation waits at most
  what is left of it (`_DeadlineStream`), whichever transport library layer asks.
- Size: bodies are read through the chat client's bounded stream (`bounded_body_hook`).
"""

from __future__ import annotations

import functools
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

import httpcore2
import httpx2
from django.conf import settings

from rollouts.policies.openai.transport import (
    AnswerTooLarge,
    UnreadableAnswer,
    bounded_body_hook,
)

# What a provider may answer one request with; event and metric pages are far smaller.
MAX_ANSWER_BYTES = 16 * 1024 * 1024

__all__ = [
    "MAX_ANSWER_BYTES",
    "AnswerTooLarge",
    "UnreadableAnswer",
    "call_seconds",
    "provider_http_client",
    "upload_seconds",
]


def call_seconds() -> float:
    """The deadline of one provider call that sends no file (connect to the last byte)."""
    return float(settings.STUDIO_TRAINING_CALL_SECONDS)


# The slowest upload a deadline allows for (1 Mbit/s): a version can be hundreds of MB.
UPLOAD_BYTES_PER_SECOND = 128 * 1024


def upload_seconds(size: int) -> float:
    """The deadline of one upload of `size` bytes: a call's deadline plus the file at
    `UPLOAD_BYTES_PER_SECOND`, at most STUDIO_TRAINING_UPLOAD_SECONDS. A provider that
    dribbles its answer to a small file holds a worker thread about a call's deadline, not
    the hour a large file may need."""
    proportional = call_seconds() + max(0, size) / UPLOAD_BYTES_PER_SECOND
    return min(float(settings.STUDIO_TRAINING_UPLOAD_SECONDS), proportional)


class _Budget(threading.local):
    deadline: float = float("inf")

    def left(self, timeout: float | None) -> float:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise httpcore2.ReadTimeout("the provider took longer than the call's deadline")
        return remaining if timeout is None else min(timeout, remaining)


class _DeadlineStream(httpcore2.NetworkStream):
    def __init__(self, inner: httpcore2.NetworkStream, budget: _Budget) -> None:
        self._inner = inner
        self._budget = budget

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._budget.left(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, self._budget.left(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        inner = self._inner.start_tls(ssl_context, server_hostname, self._budget.left(timeout))
        return _DeadlineStream(inner, self._budget)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore2.NetworkBackend):
    def __init__(self, budget: _Budget) -> None:
        self._inner = httpcore2.SyncBackend()
        self._budget = budget

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        stream = self._inner.connect_tcp(
            host, port, self._budget.left(timeout), local_address, socket_options
        )
        return _DeadlineStream(stream, self._budget)

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        stream = self._inner.connect_unix_socket(path, self._budget.left(timeout), socket_options)
        return _DeadlineStream(stream, self._budget)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One verifying context for every provider call of the process: building one (the CA
    certificates loaded) costs 20-50 ms, and every poll builds its provider anew."""
    return httpx2.create_ssl_context()


class DeadlineTransport(httpx2.BaseTransport):
    """Each request's timeout (its `read` figure) is the deadline of the whole exchange.

    One request at a time per thread: the budget is the thread's, set as a request leaves
    and holding until its body has been read (the next request sets its own).
    """

    def __init__(self) -> None:
        self._budget = _Budget()
        context = _tls_context()
        # Connections kept alive between a job's calls, made through the budgeted backend.
        self._pool = httpcore2.ConnectionPool(
            ssl_context=context, network_backend=_DeadlineBackend(self._budget)
        )
        self._inner = httpx2.HTTPTransport(verify=context)
        self._inner._pool = self._pool  # httpx's request mapping over our pool

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        seconds = (request.extensions.get("timeout") or {}).get("read") or call_seconds()
        self._budget.deadline = time.monotonic() + seconds
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()


def provider_http_client(
    *,
    client_class: type[httpx2.Client] = httpx2.Client,
    before_request: Callable[[], None] | None = None,
) -> httpx2.Client:
    """An HTTP client for a provider: never follows a redirect, deadlines, bounded bodies.

    `before_request` is called before every request leaves, each retry included; what it
    raises stops that request unsent (an endpoint an admin disabled gets no more of its key).
    """
    hooks: dict[str, list[Callable[..., Any]]] = {
        "response": [bounded_body_hook(max_bytes=MAX_ANSWER_BYTES, timeout=call_seconds())]
    }
    if before_request is not None:
        hooks["request"] = [lambda request: before_request()]
    return client_class(
        transport=DeadlineTransport(),
        follow_redirects=False,
        timeout=httpx2.Timeout(call_seconds()),
        event_hooks=hooks,
    )
