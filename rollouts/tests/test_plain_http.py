"""The plain-HTTP transport of model calls: the library's request on the wire, kept-alive
connections, dead ones noticed, no header injection, proxies left to the library."""

from __future__ import annotations

import socket
import threading

import httpx2
import openai
import pytest

from rollouts.policies.openai import shared_client
from rollouts.policies.openai.plain_http import PlainHttpTransport
from rollouts.policies.openai.transport import bounded_http_client
from rollouts.tests import openai_server as replies

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}


def client_for(url: str, *, plain: bool, api_key: str = "sk-test") -> openai.OpenAI:
    """The policy's client as built for the workers, or with the library's own transport."""
    http_client = bounded_http_client(max_bytes=10**6, timeout=10)
    if not plain:
        http_client = openai.DefaultHttpxClient(follow_redirects=False)
    return openai.OpenAI(base_url=url, api_key=api_key, max_retries=0, http_client=http_client)


def post(client: openai.OpenAI) -> bytes:
    return client.post("/chat/completions", body=BODY, cast_to=httpx2.Response).content


def test_plain_http_goes_through_it_unless_a_proxy_is_configured(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    client = bounded_http_client(max_bytes=1000, timeout=5)
    assert isinstance(client._transport_for_url(httpx2.URL("http://h/v1")), PlainHttpTransport)
    # HTTPS stays with the library's transport.
    assert not isinstance(client._transport_for_url(httpx2.URL("https://h/v1")), PlainHttpTransport)

    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    proxied = bounded_http_client(max_bytes=1000, timeout=5)
    assert not any(isinstance(t, PlainHttpTransport) for t in proxied._mounts.values())


def test_the_server_receives_what_the_librarys_own_transport_sends(chat_server):
    post(client_for(chat_server.url, plain=False))
    post(client_for(chat_server.url, plain=True))
    stock, plain = chat_server.requests
    assert plain.body == stock.body == BODY
    assert plain.path == stock.path == "/v1/chat/completions"
    # The same headers, but for the library's own (ours asks for an encoding it can bound).
    differ = {"accept-encoding", "x-stainless-retry-count", "x-stainless-read-timeout"}
    assert {k: v for k, v in plain.headers.items() if k not in differ} == {
        k: v for k, v in stock.headers.items() if k not in differ
    }
    assert plain.headers["authorization"] == "Bearer sk-test"


def test_a_thread_keeps_its_connection_alive_and_threads_do_not_share_one(chat_server):
    client = client_for(chat_server.url, plain=True)
    for _ in range(10):
        post(client)
    assert chat_server.connections == 1

    threads = [threading.Thread(target=lambda: [post(client) for _ in range(5)]) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(chat_server.requests) == 25
    assert chat_server.connections == 4


def test_an_answer_cut_at_the_cap_closes_its_connection(chat_server):
    # The rest of a body left unread must never be read as the next answer.
    chat_server.script(replies.huge(200_000), replies.tool_call("noop"))
    client = openai.OpenAI(
        base_url=chat_server.url,
        api_key="k",
        max_retries=0,
        http_client=bounded_http_client(max_bytes=10_000, timeout=10),
    )
    with pytest.raises(Exception, match="over 10000 bytes"):
        post(client)
    assert b'"interact_many"' in post(client)
    assert chat_server.connections == 2


def test_a_connection_the_server_closed_while_idle_is_not_reused():
    """A server that drops a kept-alive connection silently (an idle timeout): the next call
    opens a new one instead of failing on the dead one."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted = []
    closed = threading.Event()

    def serve():
        for _ in range(2):
            conn, _ = listener.accept()
            accepted.append(conn)
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(
                next(
                    line.split(b":")[1]
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
            )
            while len(body) < length:
                body += conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
            conn.sendall(b"Content-Length: 11\r\n\r\n" + b'{"ok": true}'[:11])
            conn.close()  # no "Connection: close": the client believes it is still open
            closed.set()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    client = client_for(f"http://127.0.0.1:{port}/v1", plain=True)
    assert post(client) == b'{"ok": true'
    # Idle, then closed by the server: without this wait the second call could leave before
    # the server's close (a race no client can see coming), and the test failed on busy hosts.
    assert closed.wait(5)
    assert post(client) == b'{"ok": true'
    server.join(timeout=5)
    listener.close()
    assert len(accepted) == 2


def test_a_key_with_a_line_break_never_reaches_the_wire(chat_server):
    client = client_for(chat_server.url, plain=True, api_key="sk-x\r\nX-Injected: 1")
    with pytest.raises(openai.APIConnectionError):
        post(client)
    assert chat_server.requests == []


def test_faults_are_the_librarys_own_errors(chat_server):
    # Refused: nothing listens on the port any more.
    with socket.create_server(("127.0.0.1", 0)) as spare:
        port = spare.getsockname()[1]
    with pytest.raises(openai.APIConnectionError) as refused:
        post(client_for(f"http://127.0.0.1:{port}/v1", plain=True))
    assert isinstance(refused.value.__cause__, httpx2.ConnectError)

    # Dropped without an answer.
    chat_server.script(replies.closed())
    with pytest.raises(openai.APIConnectionError) as dropped:
        post(client_for(chat_server.url, plain=True))
    assert isinstance(dropped.value.__cause__, httpx2.RemoteProtocolError)

    # Too slow: the read timeout, as the library's transport reports it.
    chat_server.script(replies.slow(1.0))
    slow = shared_client(
        base_url=chat_server.url, api_key="k", timeout=0.3, max_response_bytes=10**6
    )
    with pytest.raises(openai.APITimeoutError) as late:
        post(slow)
    assert isinstance(late.value.__cause__, httpx2.ReadTimeout)
