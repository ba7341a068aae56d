"""The `openai` policy: chat completions on any OpenAI-compatible endpoint (SPEC section 3).

One turn is one model call. The request holds the system prompt and one user message: the
last K turns when `history_frames` is K (a text of the actions taken, then their frames,
oldest first), then the text observation and the current frame as a
`data:image/png;base64,...` URL of exactly the stored PNG. `observation_mode` drops the
image (`text`) or the text observation (`image`). The one tool is `interact_many`
(`rollouts.tools`), with `tool_choice` `required`.

What is stored on the turn is the same request with each image part holding
`{"frame_step": N, "detail": ...}` instead of base64: the frame row is the one copy.

Faults, all recorded on the turn (`error_kind`, `error`, `retries`):

* 429, 408, 409, 5xx, timeouts and dropped connections are retried with jittered
  exponential backoff, honouring `Retry-After` / `retry-after-ms`, up to `max_retries`; each
  retry holds the endpoint's limiter again. After the last one the turn failed
  (`http_<status>`, `timeout`, `connection`) and `on_bad_output` decides: play `noop` or end
  the episode.
* Bad output (`malformed_arguments`, `unknown_action`, `wrong_tool`, `no_tool_call`,
  `empty_answer`, `refusal`) is not retried: the answer is what the model does with this
  observation. Same `on_bad_output` rule. A text answer without a tool call goes through the
  documented fallback in `rollouts.text_actions` first (`text_fallback`).
* An endpoint that cannot be reached on the episode's first call (after a short bounded
  retry), or that rejects it as misconfigured (401, 403, 404), raises `PolicyUnavailable`:
  the batch fails in seconds with one clear error. So does an endpoint that fails
  `STUDIO_OPENAI_MAX_FAILED_TURNS` turns in a row after all retries.
* A 400 that names a parameter the server does not take (`max_tokens` on reasoning models,
  `temperature`, `tool_choice` "required" on some local servers) is adapted once and resent.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import json
import random
import re
import threading
import time
from typing import Any

import openai
from django.conf import settings as django_settings
from openai.types.chat import ChatCompletion

from rollouts.crafter_env import ACTIONS
from rollouts.policies.base import Decision, Observation, PolicyUnavailable
from rollouts.rate_limit import limiter_for
from rollouts.rollout_settings import RolloutSettings
from rollouts.text_actions import actions_from_text, normalize_action
from rollouts.tools import INTERACT_MANY_TOOL, MAX_ACTIONS_PER_CALL, TOOL_NAME, system_prompt

# Local servers (vLLM, Ollama) ignore the key, but the client insists on one.
PLACEHOLDER_API_KEY = "sk-no-key"
RETRYABLE_STATUS = frozenset({408, 409, 429})
MISCONFIGURED_STATUS = frozenset({401, 403, 404})
TRANSPORT_KINDS = frozenset({"timeout", "connection"})
_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL | re.IGNORECASE)


def build_messages(
    settings: RolloutSettings, observation: Observation
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(messages to store, messages to send): identical but for the image parts."""
    with_image = settings.observation_mode in ("image_text", "image")
    with_text = settings.observation_mode in ("image_text", "text")
    detail = settings.image_detail
    pngs = {observation.frame_step: observation.png}
    parts: list[dict[str, Any]] = []

    def image(frame_step: int) -> dict[str, Any]:
        return {"type": "image_url", "image_url": {"frame_step": frame_step, "detail": detail}}

    history = observation.history[-settings.history_frames :] if settings.history_frames else ()
    if history:
        lines = [f"Your last {len(history)} turns, oldest first:"]
        lines += [
            f"- step {past.frame_step}: {', '.join(past.actions) or '(no action)'}"
            for past in history
        ]
        parts.append({"type": "text", "text": "\n".join(lines)})
        if with_image:
            for past in history:
                pngs[past.frame_step] = past.png
                parts.append({"type": "text", "text": f"Frame at step {past.frame_step}:"})
                parts.append(image(past.frame_step))
    if with_text:
        parts.append({"type": "text", "text": observation.text})
    else:
        parts.append({"type": "text", "text": "The current frame:"})
    if with_image:
        parts.append(image(observation.frame_step))
    prompt = system_prompt(observation_mode=settings.observation_mode, history_frames=len(history))
    stored = [
        {"role": "system", "content": prompt},
        {"role": "user", "content": parts},
    ]
    return stored, _with_image_data(stored, pngs)


def _with_image_data(
    messages: list[dict[str, Any]], pngs: dict[int, bytes]
) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            content = [_image_part_with_data(part, pngs) for part in content]
        sent.append({**message, "content": content})
    return sent


def _image_part_with_data(part: dict[str, Any], pngs: dict[int, bytes]) -> dict[str, Any]:
    if part.get("type") != "image_url":
        return part
    ref = part["image_url"]
    data = base64.b64encode(pngs[ref["frame_step"]]).decode("ascii")
    return {
        "type": "image_url",
        "image_url": {"url": f"data:image/png;base64,{data}", "detail": ref["detail"]},
    }


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
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        if parsed is None:
            return None
        return max(0.0, parsed.timestamp() - time.time())


_clients: dict[tuple[str, str, float], openai.OpenAI] = {}
_clients_lock = threading.Lock()


def shared_client(*, base_url: str, api_key: str, timeout: float) -> openai.OpenAI:
    """One client per endpoint, key and timeout in this process, shared by its episodes.

    Building a client costs ~0.1 s of CPU (its TLS context), as much as a whole model call's
    worth of work here; its connection pool is thread-safe and keeps connections warm.
    """
    key = (base_url, hashlib.sha256(api_key.encode()).hexdigest(), float(timeout))
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = openai.OpenAI(
                base_url=base_url or None,
                api_key=api_key,
                max_retries=0,
                timeout=openai.Timeout(timeout, connect=min(10.0, timeout)),
            )
            _clients[key] = client
        return client


class _CallFailed(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class OpenAIPolicy:
    def __init__(
        self,
        settings: RolloutSettings,
        *,
        seed: int,
        client: openai.OpenAI | None = None,
    ) -> None:
        self.settings = settings
        self.seed = seed
        self._api_key = django_settings.OPENAI_API_KEY or PLACEHOLDER_API_KEY
        self.client = client or shared_client(
            base_url=settings.base_url, api_key=self._api_key, timeout=settings.request_timeout
        )
        self.limiter = limiter_for(
            base_url=settings.base_url,
            concurrency=settings.concurrency,
            requests_per_minute=settings.requests_per_minute,
            # A lease outlives any one request, so only a dead worker's slot ever expires.
            lease_seconds=settings.request_timeout + 30,
        )
        self.params: dict[str, Any] = {
            "temperature": settings.temperature,
            "max_tokens": settings.max_tokens,
            "tool_choice": "required",
        }
        self.endpoint_answered = False
        self.failed_turns_in_row = 0

    def close(self) -> None:
        pass  # the client is shared by this process's episodes and outlives them

    def decide(self, observation: Observation) -> Decision:
        stored, sent = build_messages(self.settings, observation)
        decision = Decision(actions=[], request_messages=stored)
        try:
            completion = self._complete(sent, decision)
        except _CallFailed as failure:
            self.failed_turns_in_row += 1
            if self.failed_turns_in_row >= django_settings.STUDIO_OPENAI_MAX_FAILED_TURNS:
                raise PolicyUnavailable(
                    f"model endpoint {self._endpoint()} failed {self.failed_turns_in_row} turns "
                    f"in a row: {failure.message}"
                ) from failure
            return self._bad(decision, failure.kind, failure.message)
        self.failed_turns_in_row = 0
        return self._read(completion, decision)

    # --- the call, with retries -----------------------------------------------------------

    def _complete(self, messages: list[dict[str, Any]], decision: Decision) -> Any:
        transient_retries = 0
        connect_failures = 0
        while True:
            self.limiter.wait_turn()
            started = time.monotonic()
            wait: float | None = None
            try:
                with self.limiter.slot():
                    started = time.monotonic()
                    decision.model_called = True
                    completion = self._post(messages)
                decision.latency_ms = _ms_since(started)
                self.endpoint_answered = True
                return completion
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
                    raise _CallFailed(kind, message) from exc
                wait = retry_after_seconds(exc.response.headers)
            except openai.APITimeoutError:
                decision.latency_ms = _ms_since(started)
                kind = "timeout"
                message = f"no answer within {self.settings.request_timeout:g} s"
            except openai.APIConnectionError as exc:
                decision.latency_ms = _ms_since(started)
                kind, message = "connection", self._describe(exc)
                if not self.endpoint_answered:
                    connect_failures += 1
                    if connect_failures >= django_settings.STUDIO_OPENAI_CONNECT_ATTEMPTS:
                        raise PolicyUnavailable(
                            f"model endpoint {self._endpoint()} is unreachable "
                            f"({connect_failures} attempts): {message}"
                        ) from exc
                    # Down from the start: a short, bounded retry, not the long backoff.
                    decision.retries += 1
                    time.sleep(0.25 * connect_failures)
                    continue
            except openai.APIError as exc:
                decision.latency_ms = _ms_since(started)
                raise _CallFailed("invalid_response", self._describe(exc)) from exc
            if transient_retries >= self.settings.max_retries:
                raise _CallFailed(kind, f"{message} (after {transient_retries} retries)")
            transient_retries += 1
            decision.retries += 1
            time.sleep(self._backoff(transient_retries, wait))

    def _post(self, messages: list[dict[str, Any]]) -> ChatCompletion:
        # `chat.completions.create` with the same body, minus its per-call parameter
        # transform: that walks every message part and costs ~3 ms of CPU per call, while a
        # worker's threads share one core between the game, the recorder and the calls.
        body = {
            "model": self.settings.model,
            "messages": messages,
            "tools": [INTERACT_MANY_TOOL],
            **self.params,
        }
        return self.client.post("/chat/completions", body=body, cast_to=ChatCompletion)

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
        if "temperature" in self.params and "temperature" in text:
            del self.params["temperature"]
            return True
        if self.params.get("tool_choice") == "required" and "tool_choice" in text:
            self.params["tool_choice"] = "auto"
            return True
        return False

    def _describe(self, exc: Exception) -> str:
        message = str(getattr(exc, "message", None) or exc)
        cause = exc.__cause__
        if cause is not None and str(cause) and str(cause) not in message:
            message = f"{message} ({type(cause).__name__}: {cause})"
        if isinstance(exc, openai.APIStatusError):
            message = f"HTTP {exc.status_code}: {message}"
        # Whatever a server echoes back, the key never reaches a row or a log.
        if self._api_key != PLACEHOLDER_API_KEY:
            message = message.replace(self._api_key, "[key]")
        return message[:2000]

    def _endpoint(self) -> str:
        return self.settings.base_url or str(self.client.base_url)

    # --- the answer -----------------------------------------------------------------------

    def _read(self, completion: Any, decision: Decision) -> Decision:
        usage = getattr(completion, "usage", None)
        if usage is not None:
            decision.prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
            decision.completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
        choices = getattr(completion, "choices", None)
        if not choices:
            return self._bad(decision, "empty_answer", "the answer holds no choices")
        choice = choices[0]
        message = choice.message
        decision.finish_reason = str(choice.finish_reason or "")
        text, reasoning = _split_reasoning(message)
        decision.model_text = text
        decision.reasoning_text = reasoning
        calls = message.tool_calls or []
        decision.tool_calls = [_tool_call_json(call) for call in calls]
        refusal = getattr(message, "refusal", None)
        if refusal or (decision.finish_reason == "content_filter" and not calls):
            return self._bad(decision, "refusal", f"the model refused: {refusal or '(filtered)'}")
        if calls:
            actions: list[str] = []
            for call in decision.tool_calls:
                name, raw = call["function"]["name"], call["function"]["arguments"]
                if name != TOOL_NAME:
                    return self._bad(decision, "wrong_tool", f"called unknown tool {name!r}")
                try:
                    arguments = json.loads(raw) if raw else None
                except ValueError as exc:
                    return self._bad(
                        decision, "malformed_arguments", f"arguments are not JSON ({exc}): {raw!r}"
                    )
                listed = arguments.get("actions") if isinstance(arguments, dict) else None
                if not isinstance(listed, list) or not listed:
                    return self._bad(
                        decision,
                        "malformed_arguments",
                        f"arguments need a non-empty 'actions' list: {raw!r}",
                    )
                names = [normalize_action(a) if isinstance(a, str) else a for a in listed]
                unknown = [a for a in names if a not in ACTIONS]
                if unknown:
                    return self._bad(
                        decision, "unknown_action", f"unknown action {unknown[0]!r} in {raw!r}"
                    )
                # The schema allows 8 per call; a model that sends more gets its first 8.
                actions += names[:MAX_ACTIONS_PER_CALL]
            decision.actions = actions
            return decision
        if text and text.strip():
            actions = actions_from_text(text)
            if not actions:
                return self._bad(
                    decision, "no_tool_call", "answered in text, without a tool call or an action"
                )
            decision.actions = actions
            decision.text_fallback = True
            return decision
        return self._bad(decision, "empty_answer", "the answer holds neither a tool call nor text")

    def _bad(self, decision: Decision, kind: str, message: str) -> Decision:
        decision.error_kind = kind
        decision.error = message[:4000]
        if self.settings.on_bad_output == "end":
            decision.actions = []
            decision.end_episode = True
        else:
            decision.actions = ["noop"]
        return decision


def _split_reasoning(message: Any) -> tuple[str | None, str]:
    """(answer text, reasoning): from `reasoning_content` / `reasoning`, or `<think>` blocks."""
    text = message.content
    extra = getattr(message, "model_extra", None) or {}
    reasoning = extra.get("reasoning_content") or extra.get("reasoning") or ""
    if not isinstance(reasoning, str):
        reasoning = json.dumps(reasoning)
    if text and "<think>" in text.lower():
        thoughts = _THINK.findall(text)
        reasoning = "\n".join(filter(None, [reasoning, *(t.strip() for t in thoughts)]))
        text = _THINK.sub("", text).strip()
    return text, reasoning


def _tool_call_json(call: Any) -> dict[str, Any]:
    function = getattr(call, "function", None)
    return {
        "id": str(getattr(call, "id", "") or ""),
        "type": "function",
        "function": {
            "name": str(getattr(function, "name", "") or getattr(call, "type", "")),
            "arguments": str(getattr(function, "arguments", "") or ""),
        },
    }


def _ms_since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
