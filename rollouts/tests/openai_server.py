"""A scriptable chat-completions server on loopback, for tests and benchmarks.

It speaks the part of the OpenAI HTTP protocol the policy uses (`POST .../chat/completions`
with tools, `tool_choice` and image parts), records every request it receives, and answers
each one with the next scripted `Reply` (or `responder(body)`, or `default`): tool calls,
plain text, malformed arguments, HTTP errors with headers, slow answers, dropped
connections, empty answers, refusals, reasoning text.
"""

from __future__ import annotations

import json
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rollouts.game.tools import TOOL_NAME


@dataclass
class Reply:
    status: int = 200
    # (function name, raw arguments string) per tool call
    tool_calls: list[tuple[str, str]] = field(default_factory=list)
    content: str | None = None
    refusal: str | None = None
    reasoning: str | None = None
    finish_reason: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    error_message: str = ""
    delay: float = 0.0
    close: bool = False
    no_choices: bool = False
    usage: tuple[int, int] = (120, 12)
    # Hostile answers: a body sent as it is, or this many bytes of a JSON string streamed in
    # chunks (never held in memory), optionally gzip-compressed.
    raw_body: bytes | None = None
    content_type: str = "application/json"
    stream_bytes: int = 0
    gzip: bool = False
    # Replaces the whole JSON answer (after the usual one is built from the fields above).
    payload: Any = None


def tool_call(*actions: str, name: str = TOOL_NAME) -> Reply:
    return Reply(tool_calls=[(name, json.dumps({"actions": list(actions)}))])


def raw_arguments(arguments: str) -> Reply:
    return Reply(tool_calls=[(TOOL_NAME, arguments)])


def text(content: str, *, reasoning: str | None = None) -> Reply:
    return Reply(content=content, reasoning=reasoning)


def status(code: int, *, retry_after: str | None = None, message: str = "") -> Reply:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return Reply(status=code, headers=headers, error_message=message or f"scripted {code}")


def slow(seconds: float, reply: Reply | None = None) -> Reply:
    reply = reply or tool_call("noop")
    reply.delay = seconds
    return reply


def raw(body: bytes, *, content_type: str = "application/json", status: int = 200) -> Reply:
    return Reply(raw_body=body, content_type=content_type, status=status)


def huge(size: int, *, gzip: bool = False) -> Reply:
    return Reply(stream_bytes=size, gzip=gzip)


def closed() -> Reply:
    return Reply(close=True)


def empty() -> Reply:
    return Reply(content=None)


def refusal(message: str) -> Reply:
    return Reply(refusal=message)


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float


def completion_body(reply: Reply, *, number: int, model: str) -> dict[str, Any]:
    """The chat completion a model server sends for `reply` (its `number`-th answer)."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.refusal is not None:
        message["refusal"] = reply.refusal
    if reply.reasoning is not None:
        message["reasoning_content"] = reply.reasoning
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": f"call_{number}_{i}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            for i, (name, arguments) in enumerate(reply.tool_calls)
        ]
    finish = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
    choices = (
        [] if reply.no_choices else [{"index": 0, "message": message, "finish_reason": finish}]
    )
    prompt_tokens, completion_tokens = reply.usage
    payload = {
        "id": f"chatcmpl-{number}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
    return payload if reply.payload is None else reply.payload


class ChatServer:
    def __init__(self, *, delay: float = 0.0) -> None:
        self.delay = delay
        self.default: Reply = tool_call("noop")
        self.responder: Callable[[dict[str, Any]], Reply] | None = None
        self.requests: list[Received] = []
        self.bytes_sent = 0
        self.connections = 0  # accepted so far: a client that keeps them alive opens few
        self.in_flight = 0
        self.max_in_flight = 0
        self._script: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._count = 0
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def script(self, *replies: Reply) -> None:
        """Answer the next requests with these replies, in order, then with `default`."""
        with self._lock:
            self._script.extend(replies)

    def start(self) -> ChatServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _finish(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def _next_reply(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            if self._script:
                return self._script.popleft()
        if self.responder is not None:
            return self.responder(body)
        return self.default

    def _answer(self, reply: Reply, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        with self._lock:
            self._count += 1
            number = self._count
        if reply.raw_body is not None:
            return (
                reply.status,
                {**reply.headers, "Content-Type": reply.content_type},
                reply.raw_body,
            )
        if reply.status != 200:
            payload: dict[str, Any] = {
                "error": {"message": reply.error_message, "type": "scripted", "code": None}
            }
            return reply.status, reply.headers, json.dumps(payload).encode()
        payload = completion_body(reply, number=number, model=body.get("model", ""))
        return 200, reply.headers, json.dumps(payload).encode()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in separate writes: without this, Nagle's algorithm and
            # the client's delayed ACK add a wait to every answer.
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with server._lock:
                    server.connections += 1

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if not self.path.endswith("/chat/completions"):
                    self._send(404, {}, b'{"error": {"message": "not found"}}')
                    return
                body = json.loads(raw or b"{}")
                with server._lock:
                    server.requests.append(
                        Received(
                            self.path,
                            {k.lower(): v for k, v in self.headers.items()},
                            body,
                            time.monotonic(),
                        )
                    )
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                counted = True
                try:
                    reply = server._next_reply(body)
                    pause = server.delay + reply.delay
                    if pause:
                        time.sleep(pause)
                    answer = server._answer(reply, body)
                    # Counted out before the answer leaves: the client may send its next
                    # request the instant it has this one, and must not be seen overlapping.
                    server._finish()
                    counted = False
                    if reply.close:
                        self.close_connection = True
                        return
                    if reply.stream_bytes:
                        self._stream(reply)
                        return
                    self._send(*answer)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client gave up (a timeout): fine
                finally:
                    if counted:
                        server._finish()

            def _stream(self, reply: Reply) -> None:
                """`{"x": "aaaa...` of `stream_bytes` bytes, chunked, counted as it leaves."""
                self.close_connection = True
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                if reply.gzip:
                    self.send_header("Content-Encoding", "gzip")
                self.end_headers()
                compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
                chunk = b"a" * 65536
                left = reply.stream_bytes
                pieces = [b'{"x": "']
                while left > 0:
                    pieces.append(chunk[:left])
                    left -= len(chunk)
                    for piece in pieces:
                        out = compressor.compress(piece) if reply.gzip else piece
                        if out:
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(out), out))
                            with server._lock:
                                server.bytes_sent += len(out)
                    pieces = []
                tail = compressor.flush() if reply.gzip else b""
                self.wfile.write(
                    b"%x\r\n%s\r\n0\r\n\r\n" % (len(tail), tail) if tail else b"0\r\n\r\n"
                )

            def _send(self, code: int, headers: dict[str, str], payload: bytes) -> None:
                self.send_response(code)
                if "Content-Type" not in headers:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(payload)

        return Handler
