"""`OpenAIPolicy`: the call with its limiter, retries, backoff and fail-fast rules."""

from __future__ import annotations

import email.utils
import hashlib
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx2
import openai
from django.conf import settings as django_settings

from rollouts.game.tools import INTERACT_MANY_TOOL
from rollouts.policies.base import Decision, Observation, PolicyUnavailable, policy_seed
from rollouts.policies.endpoints import connection_check, model_connection
from rollouts.policies.openai.answers import read_answer
from rollouts.policies.openai.messages import ImageUrls, build_messages
from rollouts.policies.openai.transport import (
    ACCEPT_ENCODING,
    AnswerTooLarge,
    UnreadableAnswer,
    bounded_http_client,
)
from rollouts.policies.rate_limit import limiter_for
from rollouts.rollout_settings import RolloutSettings
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
    """One client per endpoint, key, timeout and body cap in this process, shared by episodes.

    Building a client costs ~0.1 s of CPU (its TLS context), as much as a whole model call's
    worth of work here; its connection pool is thread-safe and keeps connections warm.
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


class OpenAIPolicy:
    # Each turn is a paid request: the recorder checks for a cancel before each one.
    calls_model = True

    def __init__(
        self,
        settings: RolloutSettings,
        *,
        seed: int,
        sample: int = 0,
        client: openai.OpenAI | None = None,
        cli_api_key: str = "",
    ) -> None:
        self.settings = settings
        self.seed = seed
        # The key of the endpoint the batch names, for that endpoint's URL only (or the
        # command's own key for the URL its operator typed, when it plays inline).
        self.connection = model_connection(settings, cli_api_key=cli_api_key)
        self._api_key = self.connection.api_key or PLACEHOLDER_API_KEY
        # When the previous request left: the endpoint is read again after it, before the next.
        self._sent_at = time.monotonic()
        self.client = client or shared_client(
            base_url=self.connection.base_url,
            api_key=self._api_key,
            timeout=settings.request_timeout,
            max_response_bytes=django_settings.STUDIO_MAX_RESPONSE_BYTES,
        )
        self.limiter = limiter_for(
            base_url=self.connection.base_url,
            concurrency=settings.concurrency,
            requests_per_minute=settings.requests_per_minute,
        )
        self.params: dict[str, Any] = {
            "temperature": settings.temperature,
            "max_tokens": settings.max_tokens,
            "tool_choice": "required",
            # The one thing that differs between the samples of a seed: the same batch
            # settings replay the same samples on servers that honour it.
            "seed": policy_seed(seed=seed, sample=sample),
        }
        self.endpoint_answered = False
        self.failed_turns_in_row = 0
        # Set by the recorder: raises when the episode must not call again (its batch was
        # canceled), checked before each retry of a call.
        self.before_retry: Callable[[], None] | None = None
        # Set by the recorder (or a probe chunk): counts each request as it leaves, whether a
        # retry, so that a worker killed before its answer is written has it counted.
        self.on_send: Callable[[bool], None] | None = None
        # History shows each frame again in later turns: its base64 is made once.
        self.image_urls = ImageUrls(keep=settings.history_frames + 1)

    def close(self) -> None:
        pass  # the client is shared by this process's episodes and outlives them

    def decide(self, observation: Observation) -> Decision:
        stored, sent = build_messages(self.settings, observation, urls=self.image_urls)
        decision = Decision(actions=[], request_messages=stored)
        body, failure = self.call(sent, decision)
        if failure is not None:
            return self._bad(decision, *failure)
        bad = read_answer(body, decision, max_field_bytes=django_settings.STUDIO_MAX_ANSWER_BYTES)
        return self._bad(decision, *bad) if bad else decision

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
            self.failed_turns_in_row = 0  # it answered
            return None, (failure.kind, failure.message)
        except CallFailed as failure:
            self.failed_turns_in_row += 1
            if self.failed_turns_in_row >= django_settings.STUDIO_OPENAI_MAX_FAILED_TURNS:
                decision.error_kind, decision.error = failure.kind, failure.message
                unavailable = PolicyUnavailable(
                    f"model endpoint {self._endpoint()} failed {self.failed_turns_in_row} "
                    f"{what} in a row: {failure.message}"
                )
                unavailable.decision = decision
                raise unavailable from failure
            return None, (failure.kind, failure.message)
        self.failed_turns_in_row = 0
        return body, None

    # --- the call, with retries -----------------------------------------------------------

    def _complete(self, messages: list[dict[str, Any]], decision: Decision) -> bytes:
        transient_retries = 0
        connect_failures = 0
        while True:
            if decision.retries:
                self._stop_check(decision)  # a canceled episode sends no retry either

            def on_wait() -> None:  # while the limiter waits for its Redis to come back
                self._stop_check(decision)

            self.limiter.wait_turn(on_wait)
            started = time.monotonic()
            wait: float | None = None
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
                first_answer = not self.endpoint_answered
                self.endpoint_answered = True
                status = exc.status_code
                kind, message = f"http_{status}", self._describe(exc)
                if status == 400 and self._adapt(exc):
                    decision.retries += 1
                    continue
                if status in MISCONFIGURED_STATUS and first_answer:
                    raise PolicyUnavailable(
                        f"model endpoint {self._endpoint()} refused model "
                        f"{self.settings.model!r}: {message}"
                    ) from exc
                if status not in RETRYABLE_STATUS and status < 500:
                    raise CallFailed(kind, message) from exc
                wait = retry_after_seconds(exc.response.headers)
            except openai.APIConnectionError as exc:
                decision.latency_ms = _ms_since(started)
                # A host that drops packets times out while connecting: that is down, not slow.
                connecting = type(exc.__cause__).__name__ == "ConnectTimeout"
                if isinstance(exc, openai.APITimeoutError) and not connecting:
                    kind = "timeout"
                    message = f"no answer within {self.settings.request_timeout:g} s"
                else:
                    # Nothing more than this: refused, reset, unknown host and filtered ports
                    # look alike, so an error message is no port scanner.
                    kind, message = "connection", "unreachable"
                if kind == "connection" and not self.endpoint_answered:
                    connect_failures += 1
                    if connect_failures >= django_settings.STUDIO_OPENAI_CONNECT_ATTEMPTS:
                        raise PolicyUnavailable(
                            f"model endpoint {self._endpoint()} is unreachable "
                            f"({connect_failures} attempts)"
                        ) from exc
                    # Down from the start: a short, bounded retry, not the long backoff.
                    decision.retries += 1
                    time.sleep(0.25 * connect_failures)
                    continue
            except openai.APIError as exc:
                decision.latency_ms = _ms_since(started)
                raise UnusableAnswer("invalid_response", self._describe(exc)) from exc
            if transient_retries >= self.settings.max_retries:
                raise CallFailed(kind, f"{message} (after {transient_retries} retries)")
            transient_retries += 1
            decision.retries += 1
            time.sleep(self._backoff(transient_retries, wait))

    def _stop_check(self, decision: Decision) -> None:
        """`before_retry`: raises when the episode must not call again (canceled, claim lost)."""
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
        # transform: that walks every message part and costs ~3 ms of CPU per call, while a
        # worker's threads share one core between the game, the recorder and the calls.
        # The raw body comes back (read within the transport's bounds): `read_answer` parses
        # and checks it, instead of the library's models, which take any shape as it comes.
        body = {
            "model": self.settings.model,
            "messages": messages,
            "tools": [INTERACT_MANY_TOOL],
            **self.params,
        }
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

    def _endpoint(self) -> str:
        return self.connection.label

    def _bad(self, decision: Decision, kind: str, message: str) -> Decision:
        decision.error_kind = kind
        decision.error = storable(message, max_bytes=4000)
        if self.settings.on_bad_output == "end":
            decision.actions = []
            decision.end_episode = True
        else:
            decision.actions = ["noop"]
        return decision


def _ms_since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
