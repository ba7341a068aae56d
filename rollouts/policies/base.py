"""The small interface every policy implements."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class PastTurn:
    """A turn already played, for policies that show history."""

    frame_step: int
    png: bytes
    actions: tuple[str, ...]


@dataclass(frozen=True)
class Observation:
    seed: int
    turn: int
    step: int
    step_limit: int
    text: str
    frame_step: int
    png: bytes
    history: tuple[PastTurn, ...] = ()


@dataclass
class Decision:
    """What a policy decided, and everything worth recording about how."""

    actions: list[str]
    # Messages as sent. Image parts hold {"frame_step": N} instead of base64 data.
    request_messages: list[dict[str, Any]] = field(default_factory=list)
    model_text: str | None = None
    reasoning_text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = ""
    error: str = ""
    error_kind: str = ""
    text_fallback: bool = False
    model_called: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: int = 0
    retries: int = 0
    # Fields of the answer cut to fit when stored: {"model_text": original bytes, ...}.
    truncated: dict[str, int] = field(default_factory=dict)
    # Bad output that the settings say should end the episode.
    end_episode: bool = False

    @property
    def call_failed(self) -> bool:
        """The model call itself failed (`http_<status>`, `timeout`, `connection`), as
        opposed to an answer that could not be used (`unknown_action`, `refusal`, ...)."""
        kind = self.error_kind
        return kind.startswith("http_") or kind in ("timeout", "connection")


def policy_seed(*, seed: int, sample: int) -> int:
    """The seed of a policy's own sampling for sample `sample` of world `seed`.

    Sample 0 keeps the world seed (batches of one sample per seed play as they always did);
    other samples get a value derived from both, below 2**31 so that every server takes it.
    """
    if sample == 0:
        return int(seed)
    digest = hashlib.sha256(f"{int(seed)}:{int(sample)}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


class PolicyUnavailable(Exception):
    """The policy cannot act at all (e.g. its endpoint is down): fail fast, do not play on.

    `decision`: what the turn that gave up had sent and spent, to be counted."""

    decision: Decision | None = None


class Policy(Protocol):
    def decide(self, observation: Observation) -> Decision: ...

    def close(self) -> None: ...
