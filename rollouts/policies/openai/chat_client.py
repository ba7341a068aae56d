"""`ChatClient`: one OpenAI-compatible endpoint's chat completions, as every caller needs them.

The rollout policy (`OpenAIPolicy`, one call a turn) and the probe asker (`probes.asking`,
one call a question) both hold one; what differs between them is the body's parameters and
tools, given when it is made. What it does (see `rollouts.policies.openai` for the rules):
the request, the endpoint's limiter, retries with backoff, the bounded body, the key sent to
its own endpoint only (read again before every request), the give-up rule, and the count of
each request as it leaves (`on_send`) with a stop check before each retry (`before_retry`).
"""

from __future__ import annotations

import email.utils
import hashlib
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx2
import openai
from django.conf import settings as django_settings

from rollouts.policies.base import Decision, PolicyUnavailable
from rollouts.policies.endpoints import connection_check, model_connection
from rollouts.policies.openai.transport import (
    ACCEPT_ENCODING,
    AnswerTooLarge,
    UnreadableAnswer,
    bounded_http_client,
)
from rollouts.policies.rate_limit import limiter_for
from rollouts.rollout_settings import RolloutSettings, default_of
from studio.redaction import redact_key
from studio.untrusted import storable

# Local servers (vLLM, Ollama) ignore the key, but the client insists on one.
PLACEHOLDER_API_KEY = "sk-no-key"
RETRYABLE_STATUS = frozenset({408, 409, 429})
MISCONFIGURED_STATUS = frozenset({401, 403, 404})


def retry_after_seconds(headers: Any) -> float | None:
    """The server's requested wait: `retry-after-ms`, or `Retry-After` in seconds or a date."""
    if headers is None:
        return None
    value = headers.get("retry-after-ms")
    if value:
        try:
            return max(0.0, float(value) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, parsed.timestamp() - time.time())


_clients: dict[tuple[str, str, float, int], openai.OpenAI] = {}
_clients_lock = threading.Lock()


def shared_client(
    *, base_url: str, api_key: str, timeout: float, max_response_bytes: int
) -> openai.OpenAI:
    """One client per endpoint, key, timeout and body cap in this process, shared by callers.

    Building a client costs as much CPU (its TLS context) as a whole model call's worth of
    work here; its connection pool is thread-safe and keeps connections warm.
    """
    key = (
        base_url,
        hashlib.sha256(api_key.encode()).hexdigest(),
        float(timeout),
        max_response_bytes,
    )
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = openai.OpenAI(
                base_url=base_url or None,
                api_key=api_key,
                max_retries=0,
                timeout=openai.Timeout(timeout, connect=min(10.0, timeout)),
                default_headers={"Accept-Encoding": ACCEPT_ENCODING},
                http_client=bounded_http_client(max_bytes=max_response_bytes, timeout=timeout),
            )
            _clients[key] = client
        return client


class CallFailed(Exception):
    """The call failed (`http_<status>`, `timeout`, `connection`): counts toward giving up."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class UnusableAnswer(CallFailed):
    """The server answered, with something that cannot be read: bad output."""


@dataclass(frozen=True)
class ChatOptions:
    """Where the calls go and how hard they are tried: a batch's options (`of`) or a probe
    run's (the rollouts' defaults for what it does not set)."""

    model: str
    endpoint: str = ""  # an admin-named endpoint; "" for a URL given on the command line
    base_url: str = ""
    concurrency: int = default_of("concurrency")
    requests_per_minute: int = 0
    request_timeout: float = default_of("request_timeout")
    max_retries: int = default_of("max_retries")

    @classmethod
    def of(cls, settings: RolloutSettings) -> ChatOptions:
        return cls(
            model=settings.model,
            endpoint=settings.endpoint,
            base_url=settings.base_url,
            concurrency=settings.concurrency,
            requests_per_minute=settings.requests_per_minute,
            request_timeout=settings.request_timeout,
            max_retries=settings.max_retries,
        )


class HoldsChatClient:
    """The two hooks a caller's owner sets (the recorder on a policy, a chunk on its asker),
    kept by the `ChatClient` in `self.chat`: the stop check before each retry and the count
    of each request as it leaves."""

    chat: ChatClient

    @property
    def before_retry(self) -> Callable[[], None] | None:
        return self.chat.before_retry

    @before_retry.setter
    def before_retry(self, check: Callable[[], None] | None) -> None:
        self.chat.before_retry = check

    @property
    def on_send(self) -> Callable[[bool], None] | None:
        return self.chat.on_send

    @on_send.setter
    def on_send(self, count: Callable[[bool], None] | None) -> None:
        self.chat.on_send = count


class ChatClient:
    """Calls to one endpoint for one caller (an episode, a probe chunk), in one thread.

    `params`: the body's parameters besides model, messages and tools (temperature, ...);
    changed in place when a server rejects one by name. `tools`: offered with every call,
    or none (the answer is then the message's text)."""

    def __init__(
        self,
        options: ChatOptions,
        *,
        params: dict[str, Any],
        tools: list[dict[str, Any]] | None = None,
        client: openai.OpenAI | None = None,
        cli_api_key: str = "",
    ) -> None:
        self.options = options
        self.params = params
        self.tools = tools
        # The key of the endpoint the caller names, for that endpoint's URL only (or the
        # command's own key for the URL its operator typed, when it plays inline).
        self.connection = model_connection(options, cli_api_key=cli_api_key)
        self._api_key = self.connection.api_key or PLACEHOLDER_API_KEY
        # When the previous request left: the endpoint is read again after it, before the next.
        self._sent_at = time.monotonic()
        self.client = client or shared_client(
            base_url=self.connection.base_url,
            api_key=self._api_key,
            timeout=options.request_timeout,
            max_response_bytes=django_settings.STUDIO_MAX_RESPONSE_BYTES,
        )
        self.limiter = limiter_for(
            base_url=self.connection.base_url,
            concurrency=options.concurrency,
            requests_per_minute=options.requests_per_minute,
        )
        self.endpoint_answered = False
        self.failed_in_row = 0
        # Set by the caller's owner (the recorder, a probe chunk): raises when no more call
        # may be made (a canceled batch, a lost claim), checked before each retry and while
        # the limiter waits.
        self.before_retry: Callable[[], None] | None = None
        # Counts each request as it leaves, whether a retry, so that a worker killed before
        # its answer is written has it counted.
        self.on_send: Callable[[bool], None] | None = None

    def call(
        self, messages: list[dict[str, Any]], decision: Decision, *, what: str = "turns"
    ) -> tuple[bytes, None] | tuple[None, tuple[str, str]]:
        """One model call with its retries, and the rule that gives up on an endpoint that
        fails `STUDIO_OPENAI_MAX_FAILED_TURNS` `what` (turns, questions) in a row: the answer's
        body, or the failure's (kind, message) when it failed or could not be used. Raises
        `PolicyUnavailable`, its `decision` saying what was sent (to be counted all the same),
        once the endpoint is unusable."""
        try:
            body = self._complete(messages, decision)
        except PolicyUnavailable as unavailable:
            unavailable.decision = decision
            raise
        except UnusableAnswer as failure:
            self.failed_in_row = 0  # it answered
            return None, (failure.kind, failure.message)
        except CallFailed as failure:
            self.failed_in_row += 1
            if self.failed_in_row >= django_settings.STUDIO_OPENAI_MAX_FAILED_TURNS:
                decision.error_kind, decision.error = failure.kind, failure.message
                unavailable = PolicyUnavailable(
                    f"model endpoint {self.connection.label} failed {self.failed_in_row} "
                    f"{what} in a row: {failure.message}"
                )
                unavailable.decision = decision
                raise unavailable from failure
            return None, (failure.kind, failure.message)
        self.failed_in_row = 0
        return body, None

    # --- the call, with retries -----------------------------------------------------------

    def _complete(self, messages: list[dict[str, Any]], decision: Decision) -> bytes:
        transient_retries = 0
        connect_failures = 0
        while True:
            if decision.retries:
                self._stop_check(decision)  # a canceled caller sends no retry either

            def on_wait() -> None:  # while the limiter waits for its Redis to come back
                self._stop_check(decision)

            self.limiter.wait_turn(on_wait)
            started = time.monotonic()
            try:
                with self.limiter.slot(on_wait):
                    self._endpoint_check(decision)
                    if self.on_send is not None:
                        self.on_send(decision.model_called)
                    started = time.monotonic()
                    decision.model_called = True
                    body = self._post(messages)
                decision.latency_ms = _ms_since(started)
                self.endpoint_answered = True
                return body
            except AnswerTooLarge as exc:
                decision.latency_ms = _ms_since(started)
                self.endpoint_answered = True
                raise UnusableAnswer("answer_too_large", str(exc)) from exc
            except UnreadableAnswer as exc:
                decision.latency_ms = _ms_since(started)
                self.endpoint_answered = True
                raise UnusableAnswer("invalid_response", str(exc)) from exc
            except openai.APIStatusError as exc:
                decision.latency_ms = _ms_since(started)
                resent, wait, failure = self._status_failure(exc, decision)
                if resent:
                    continue
            except openai.APIConnectionError as exc:
                decision.latency_ms = _ms_since(started)
                wait = None
                failure = self._connection_failure(exc)
                if failure.kind == "connection" and not self.endpoint_answered:
                    connect_failures += 1
                    if connect_failures >= django_settings.STUDIO_OPENAI_CONNECT_ATTEMPTS:
                        raise PolicyUnavailable(
                            f"model endpoint {self.connection.label} is unreachable "
                            f"({connect_failures} attempts)"
                        ) from exc
                    # Down from the start: a short, bounded retry, not the long backoff.
                    decision.retries += 1
                    time.sleep(0.25 * connect_failures)
                    continue
            except openai.APIError as exc:
                decision.latency_ms = _ms_since(started)
                raise UnusableAnswer("invalid_response", self._describe(exc)) from exc
            if transient_retries >= self.options.max_retries:
                raise CallFailed(
                    failure.kind, f"{failure.message} (after {transient_retries} retries)"
                )
            transient_retries += 1
            decision.retries += 1
            time.sleep(self._backoff(transient_retries, wait))

    def _status_failure(
        self, exc: openai.APIStatusError, decision: Decision
    ) -> tuple[bool, float | None, CallFailed]:
        """What an HTTP error status means: (resent after adapting a parameter, the server's
        requested wait, the retryable failure). Raises when it is not to be retried."""
        first_answer = not self.endpoint_answered
        self.endpoint_answered = True
        status = exc.status_code
        failure = CallFailed(f"http_{status}", self._describe(exc))
        if status == 400 and self._adapt(exc):
            decision.retries += 1
            return True, None, failure
        if status in MISCONFIGURED_STATUS and first_answer:
            raise PolicyUnavailable(
                f"model endpoint {self.connection.label} refused model "
                f"{self.options.model!r}: {failure.message}"
            ) from exc
        if status not in RETRYABLE_STATUS and status < 500:
            raise failure from exc
        return False, retry_after_seconds(exc.response.headers), failure

    def _connection_failure(self, exc: openai.APIConnectionError) -> CallFailed:
        # A host that drops packets times out while connecting: that is down, not slow.
        connecting = type(exc.__cause__).__name__ == "ConnectTimeout"
        if isinstance(exc, openai.APITimeoutError) and not connecting:
            return CallFailed("timeout", f"no answer within {self.options.request_timeout:g} s")
        # Nothing more than this: refused, reset, unknown host and filtered ports look alike,
        # so an error message is no port scanner.
        return CallFailed("connection", "unreachable")

    def _stop_check(self, decision: Decision) -> None:
        """`before_retry`: raises when no more call may be made (canceled, claim lost)."""
        if self.before_retry is None:
            return
        try:
            self.before_retry()
        except Exception as stop:
            if decision.retries:
                decision.retries -= 1  # counted when it was planned; never sent
            stop.decision = decision  # what was sent before it: to be counted
            raise

    def _endpoint_check(self, decision: Decision) -> None:
        """Before every request, the first and each retry, after any wait for the limiter: an
        endpoint an admin disabled (or moved, or gave another key) gets no more of its key."""
        try:
            connection_check(self.connection, since=self._sent_at)
        except PolicyUnavailable:
            if decision.model_called:
                decision.retries -= 1  # counted when it was planned; never sent
            raise
        self._sent_at = time.monotonic()

    def _post(self, messages: list[dict[str, Any]]) -> bytes:
        # `chat.completions.create` with the same body, minus its per-call parameter
        # transform: that walks every message part, while a worker's threads share one core
        # between the game, the recorder and the calls. The raw body comes back (read within
        # the transport's bounds): `read_answer` parses and checks it, instead of the
        # library's models, which take any shape as it comes.
        body: dict[str, Any] = {"model": self.options.model, "messages": messages}
        if self.tools:
            body["tools"] = self.tools
        body.update(self.params)
        response = self.client.post("/chat/completions", body=body, cast_to=httpx2.Response)
        return response.content

    def _backoff(self, retry: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, django_settings.STUDIO_OPENAI_MAX_RETRY_AFTER)
        ceiling = django_settings.STUDIO_OPENAI_BACKOFF_BASE * 2 ** (retry - 1)
        ceiling = min(ceiling, django_settings.STUDIO_OPENAI_BACKOFF_MAX)
        return random.uniform(ceiling / 2, ceiling)

    def _adapt(self, exc: openai.APIStatusError) -> bool:
        """Resend without a parameter the server rejects by name; each change happens once."""
        text = f"{exc.message} {exc.body}".lower()
        if "max_tokens" in self.params and "max_completion_tokens" in text:
            self.params["max_completion_tokens"] = self.params.pop("max_tokens")
            return True
        unsupported = "support" in text  # "unsupported value", "is not supported", ...
        if "temperature" in self.params and "temperature" in text and unsupported:
            del self.params["temperature"]
            return True
        if "seed" in self.params and "seed" in text and unsupported:
            del self.params["seed"]
            return True
        if self.params.get("tool_choice") == "required" and "tool_choice" in text and unsupported:
            self.params["tool_choice"] = "auto"
            return True
        return False

    def _describe(self, exc: Exception) -> str:
        message = str(getattr(exc, "message", None) or exc)
        if isinstance(exc, openai.APIStatusError):
            message = f"HTTP {exc.status_code}: {message}"
        # Whatever a server echoes back, the key (or its masked echo) never reaches a row or
        # a log; the text itself is the server's, so it is cleaned like an answer.
        key = self._api_key if self._api_key != PLACEHOLDER_API_KEY else ""
        return storable(redact_key(message[:20_000], key), max_bytes=2000)


def _ms_since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
