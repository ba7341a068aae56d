"""Asking a model one probe question through the rollouts' own chat client.

`ProbeAsker` holds a `rollouts.policies.openai.ChatClient`, as a rollout's policy does, with
its own body (no tool: the model answers in text, which `probes.prompting.parse_choice`
reads) and everything else the same: the shared HTTP client (bounded answers, no redirect,
plain HTTP where it can), the limiter (concurrency and requests per minute per endpoint,
across workers, in Redis), the retries and backoff for 429, 5xx, timeouts and drops, the
fail-fast rules (`PolicyUnavailable`: unreachable from the start, 401/403/404 on the first
answer, or `STUDIO_OPENAI_MAX_FAILED_TURNS` questions in a row failed after their retries),
the key handling (an admin-named endpoint's key to that endpoint's URL only, and to no
request after an admin disabled it: the chunk and its run fail with one line), and the
reading of a hostile answer (`read_answer`: NUL, lone surrogates and oversize fields cleaned
and counted as bad output).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings as django_settings

from probes.prompting import parse_choice
from rollouts.policies.base import Decision, policy_seed
from rollouts.policies.openai import ChatClient, ChatOptions, HoldsChatClient, read_answer
from rollouts.rollout_settings import default_of
from studio.untrusted import storable

ERROR_BYTES = 4000
PREVIEW_CHARS = 200
# A question asks for one letter, so a few tokens are the whole answer. A batch's default
# budget is sized for a turn's tool call; a model that does not stop (an untrained one) would
# spend all of it on every question, slowing a run many times over for answers that are
# unparsed either way.
ANSWER_MAX_TOKENS = 32


@dataclass
class Asked:
    """What one question's call gave: the choice read ("" for none) and how it went."""

    choice: str = ""
    model_text: str = ""
    error_kind: str = ""
    error: str = ""
    model_called: bool = False
    latency_ms: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retries: int = 0

    @property
    def requests(self) -> int:
        """Requests sent for it: the first and each retry (none when nothing was sent)."""
        return 1 + self.retries if self.model_called else 0


class ProbeAsker(HoldsChatClient):
    """One per chunk of a run (in one thread): `ask(messages, choices)` per question.

    `options`: the run's model, endpoint, URL and limits. The body's parameters are a batch's
    default temperature, `ANSWER_MAX_TOKENS` and the probe set's seed."""

    def __init__(self, options: ChatOptions, *, seed: int) -> None:
        self.chat = ChatClient(
            options,
            params={
                "temperature": default_of("temperature"),
                "max_tokens": ANSWER_MAX_TOKENS,
                "seed": policy_seed(seed=seed, sample=0),
            },
        )

    def ask(self, messages: list[dict[str, Any]], choices: list[str]) -> Asked:
        """Ask one question; raises `PolicyUnavailable` only when the endpoint is unusable
        (its `decision` says what the question that gave up had sent)."""
        decision = Decision(actions=[])
        body, failure = self.chat.call(messages, decision, what="questions")
        if failure is not None:
            return asked_from(decision, *failure)
        bad = read_answer(body, decision, max_field_bytes=django_settings.STUDIO_MAX_ANSWER_BYTES)
        kind = bad[0] if bad else ""
        # `read_answer` reads a rollout's turn: a text answer is "no_tool_call" there (or a
        # move it recognised in the text); here text is what is wanted.
        if decision.tool_calls:
            return asked_from(decision, "tool_call", "answered with a tool call, not a choice")
        if kind not in ("", "no_tool_call"):
            return asked_from(decision, kind, bad[1])
        text = decision.model_text or ""
        choice = parse_choice(text, choices)
        if choice is None:
            preview = text.strip()[:PREVIEW_CHARS]
            return asked_from(decision, "unparsed", f"the answer names no choice: {preview!r}")
        asked = asked_from(decision, "", "")
        asked.choice = choice
        return asked


def asked_from(decision: Decision, kind: str, message: str) -> Asked:
    """What a call's `Decision` says of it, with an error kind and message (or "")."""
    return Asked(
        model_text=decision.model_text or "",
        error_kind=kind,
        error=storable(message, max_bytes=ERROR_BYTES),
        model_called=decision.model_called,
        latency_ms=decision.latency_ms,
        prompt_tokens=decision.prompt_tokens,
        completion_tokens=decision.completion_tokens,
        retries=decision.retries,
    )
