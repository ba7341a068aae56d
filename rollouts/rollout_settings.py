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
MAX_SAMPLES_PER_SEED = 64
MAX_EPISODES = 10_000
# Tried with crafter 1.8.3: at 17 px and less every reset() raises "height and width must be
# > 0" (a cell of the 9x9 grid is then too small for its item textures); 18 to 1024 render.
MIN_IMAGE_SIZE = 18
MAX_IMAGE_SIZE = 1024
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


def seeds_spec(seeds: list[int] | tuple[int, ...]) -> str:
    """The inverse of `parse_seeds`: [0, 1, 2, 3, 7] -> `0-3,7`."""
    parts: list[str] = []
    ordered = sorted(set(seeds))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


@dataclass(frozen=True)
class RolloutSettings:
    policy: str
    seeds: tuple[int, ...] = (0,)
    # K episodes of each seed (best-of-N, preference pairs); sample i seeds the policy's sampling
    samples_per_seed: int = 1
    steps: int = 256
    image_size: int = 64
    actions: tuple[str, ...] = DEFAULT_SCRIPT
    name: str = ""
    # openai policy
    model: str = ""
    # An admin-named endpoint (`studio.models.Endpoint`) and its base URL when the batch was
    # created; without a name, a URL given on the command line.
    endpoint: str = ""
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

    @classmethod
    def unchecked(cls, **values: Any) -> RolloutSettings:
        """An instance without validation, to list all its `problems()` (forms)."""
        instance = object.__new__(cls)
        for f in dataclasses.fields(cls):
            if f.name in values:
                value = values[f.name]
            elif f.default is not dataclasses.MISSING:
                value = f.default
            else:
                value = f.default_factory()  # type: ignore[misc]
            object.__setattr__(instance, f.name, value)
        return instance

    def validate(self) -> None:
        problems = self.problems()
        if problems:
            field_name, message = problems[0]
            raise SettingsError(f"{field_name.replace('_', '-')}: {message}")

    def problems(self) -> list[tuple[str, str]]:
        """Every invalid option as (field name, what is wrong), for a form to show at once."""
        found: list[tuple[str, str]] = []

        def check(ok: bool, field_name: str, message: str) -> None:
            if not ok:
                found.append((field_name, message))

        check(
            self.policy in (*POLICIES, HUMAN_POLICY),
            "policy",
            f"{self.policy!r} is not one of {', '.join(POLICIES)}",
        )
        check(bool(self.seeds), "seeds", "at least one seed is needed")
        check(
            all(0 <= s < 2**31 - 1 for s in self.seeds),
            "seeds",
            "each seed must be between 0 and 2147483646",
        )
        check(
            1 <= self.samples_per_seed <= MAX_SAMPLES_PER_SEED,
            "samples_per_seed",
            f"{self.samples_per_seed} is not between 1 and {MAX_SAMPLES_PER_SEED}",
        )
        check(
            len(self.seeds) * self.samples_per_seed <= MAX_EPISODES,
            "samples_per_seed",
            f"{len(self.seeds)} seeds x {self.samples_per_seed} samples is more than "
            f"{MAX_EPISODES} episodes in one batch",
        )
        check(1 <= self.steps <= 10_000, "steps", f"{self.steps} is not between 1 and 10000")
        check(
            MIN_IMAGE_SIZE <= self.image_size <= MAX_IMAGE_SIZE,
            "image_size",
            f"{self.image_size} is not between {MIN_IMAGE_SIZE} and {MAX_IMAGE_SIZE} "
            f"(crafter draws nothing below {MIN_IMAGE_SIZE} px)",
        )
        check(bool(self.actions), "actions", "at least one action is needed")
        unknown = [a for a in self.actions if a not in ACTIONS]
        check(
            not unknown,
            "actions",
            f"unknown action {unknown[0]!r}; known: {', '.join(ACTIONS)}" if unknown else "",
        )
        check(
            0 <= self.history_frames <= 9,
            "history_frames",
            f"{self.history_frames} is not between 0 and 9",
        )
        check(
            1 <= self.concurrency <= 256,
            "concurrency",
            f"{self.concurrency} is not between 1 and 256",
        )
        check(
            self.image_detail in IMAGE_DETAILS,
            "image_detail",
            f"{self.image_detail!r} is not one of {IMAGE_DETAILS}",
        )
        check(
            self.observation_mode in OBSERVATION_MODES,
            "observation_mode",
            f"{self.observation_mode!r} is not one of {OBSERVATION_MODES}",
        )
        check(
            self.on_bad_output in ON_BAD_OUTPUT,
            "on_bad_output",
            f"{self.on_bad_output!r} is not one of {ON_BAD_OUTPUT}",
        )
        check(
            0 <= self.max_retries <= 20,
            "max_retries",
            f"{self.max_retries} is not between 0 and 20",
        )
        check(
            0 < self.request_timeout <= 600,
            "request_timeout",
            f"{self.request_timeout} is not in (0, 600]",
        )
        check(
            0 <= self.temperature <= 2,
            "temperature",
            f"{self.temperature} is not between 0 and 2",
        )
        check(
            1 <= self.max_tokens <= 32_768,
            "max_tokens",
            f"{self.max_tokens} is not between 1 and 32768",
        )
        check(
            self.requests_per_minute >= 0,
            "requests_per_minute",
            "must be 0 (no limit) or more",
        )
        check(
            self.policy != "openai" or bool(self.model),
            "model",
            "the openai policy needs --model",
        )
        return found

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
