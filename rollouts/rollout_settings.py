"""The options of a rollout batch: one object for the command, the task and the form."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from rollouts.crafter_env import ACTIONS

POLICIES = ("scripted", "random", "openai")
# `human` games are played in the browser (rollouts.services_play), never by a worker.
HUMAN_POLICY = "human"
DEFAULT_SCRIPT = ("move_right", "move_down", "move_left", "move_up", "do")
OBSERVATION_MODES = ("image_text", "image", "text")
IMAGE_DETAILS = ("auto", "low", "high")
ON_BAD_OUTPUT = ("noop", "end")
MAX_SEEDS = 10_000
_SEED_PART = re.compile(r"^(\d+)(?:-(\d+))?$")


class SettingsError(ValueError):
    """A rollout option is invalid; the message says which and why, in one line."""


def parse_seeds(spec: str) -> list[int]:
    """`7`, `0-9` or `1,5,9-12` -> sorted unique seeds."""
    seeds: set[int] = set()
    text = str(spec).strip()
    if not text:
        raise SettingsError("seeds: empty; use a form like 7, 0-9 or 1,5,9-12")
    for part in text.split(","):
        match = _SEED_PART.match(part.strip())
        if not match:
            raise SettingsError(f"seeds: {part.strip()!r} is not a seed or a range like 0-9")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low:
            raise SettingsError(f"seeds: range {part.strip()!r} ends before it starts")
        if high - low + 1 + len(seeds) > MAX_SEEDS:
            raise SettingsError(f"seeds: more than {MAX_SEEDS} seeds in one batch")
        seeds.update(range(low, high + 1))
    return sorted(seeds)


@dataclass(frozen=True)
class RolloutSettings:
    policy: str
    seeds: tuple[int, ...] = (0,)
    steps: int = 256
    image_size: int = 64
    actions: tuple[str, ...] = DEFAULT_SCRIPT
    name: str = ""
    # openai policy
    model: str = ""
    base_url: str = ""
    history_frames: int = 0
    concurrency: int = 4
    temperature: float = 0.0
    max_tokens: int = 512
    image_detail: str = "auto"
    observation_mode: str = "image_text"
    on_bad_output: str = "noop"
    max_retries: int = 4
    request_timeout: float = 60.0
    requests_per_minute: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.policy not in (*POLICIES, HUMAN_POLICY):
            raise SettingsError(f"policy: {self.policy!r} is not one of {', '.join(POLICIES)}")
        if not self.seeds:
            raise SettingsError("seeds: at least one seed is needed")
        if any(s < 0 or s >= 2**31 - 1 for s in self.seeds):
            raise SettingsError("seeds: each seed must be between 0 and 2147483646")
        if not 1 <= self.steps <= 10_000:
            raise SettingsError(f"steps: {self.steps} is not between 1 and 10000")
        if not 9 <= self.image_size <= 1024:
            raise SettingsError(f"image-size: {self.image_size} is not between 9 and 1024")
        if not self.actions:
            raise SettingsError("actions: at least one action is needed")
        unknown = [a for a in self.actions if a not in ACTIONS]
        if unknown:
            raise SettingsError(
                f"actions: unknown action {unknown[0]!r}; known: {', '.join(ACTIONS)}"
            )
        if not 0 <= self.history_frames <= 9:
            raise SettingsError(f"history-frames: {self.history_frames} is not between 0 and 9")
        if not 1 <= self.concurrency <= 256:
            raise SettingsError(f"concurrency: {self.concurrency} is not between 1 and 256")
        if self.image_detail not in IMAGE_DETAILS:
            raise SettingsError(
                f"image-detail: {self.image_detail!r} is not one of {IMAGE_DETAILS}"
            )
        if self.observation_mode not in OBSERVATION_MODES:
            raise SettingsError(
                f"observation-mode: {self.observation_mode!r} is not one of {OBSERVATION_MODES}"
            )
        if self.on_bad_output not in ON_BAD_OUTPUT:
            raise SettingsError(
                f"on-bad-output: {self.on_bad_output!r} is not one of {ON_BAD_OUTPUT}"
            )
        if not 0 <= self.max_retries <= 20:
            raise SettingsError(f"max-retries: {self.max_retries} is not between 0 and 20")
        if not 0 < self.request_timeout <= 600:
            raise SettingsError(f"request-timeout: {self.request_timeout} is not in (0, 600]")
        if not 0 <= self.temperature <= 2:
            raise SettingsError(f"temperature: {self.temperature} is not between 0 and 2")
        if not 1 <= self.max_tokens <= 32_768:
            raise SettingsError(f"max-tokens: {self.max_tokens} is not between 1 and 32768")
        if self.requests_per_minute < 0:
            raise SettingsError("requests-per-minute: must be 0 (no limit) or more")
        if self.policy == "openai" and not self.model:
            raise SettingsError("model: the openai policy needs --model")

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["seeds"] = list(self.seeds)
        data["actions"] = list(self.actions)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RolloutSettings:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for key in ("seeds", "actions"):
            if key in values:
                values[key] = tuple(values[key])
        return cls(**values)
