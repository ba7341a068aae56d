"""What an episode counts while it plays (steps, reward, achievements, model calls and
tokens), as its row stores it and as its batch adds it up."""

from __future__ import annotations

from dataclasses import dataclass, field

from rollouts.policies.base import (
    Decision,
)

# The batch's model counters, as each episode adds its share to them when it ends.
BATCH_COUNTERS = (
    "model_calls",
    "model_errors",
    "model_retries",
    "prompt_tokens",
    "completion_tokens",
)
# An episode's model counters, as its row stores them while it plays and when it ends.
EPISODE_COUNTERS = (
    "tool_calls",
    "model_calls",
    "model_errors",
    "model_retries",
    "bad_outputs",
    "prompt_tokens",
    "completion_tokens",
)


def batch_counters_of(counters: dict[str, int | None]) -> dict[str, int]:
    """An episode's (or episodes' summed) row counters as its batch counts them."""
    totals = EpisodeTotals()
    totals.restore({name: value or 0 for name, value in counters.items()}, credited=False)
    return totals.batch_counters()


@dataclass
class EpisodeTotals:
    steps: int = 0
    total_reward: float = 0.0
    achievements: dict[str, int] = field(default_factory=dict)
    tool_calls: int = 0
    model_calls: int = 0
    model_errors: int = 0
    model_retries: int = 0
    bad_outputs: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # What of `batch_counters()` the batch row counts already: an episode adds what it has
    # not yet when it ends (finished, failed, canceled), so an episode resumed after an end
    # adds only what came after.
    credited: dict[str, int] = field(default_factory=dict)

    def batch_counters(self) -> dict[str, int]:
        """This episode's share of its batch's counters (bad outputs count as errors there)."""
        return {
            "model_calls": self.model_calls,
            "model_errors": self.model_errors + self.bad_outputs,
            "model_retries": self.model_retries,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
        }

    def uncredited(self, counters: dict[str, int] | None = None) -> dict[str, int]:
        """What the batch has not counted yet of `counters` (by default, the current ones)."""
        counters = self.batch_counters() if counters is None else counters
        return {name: counters[name] - self.credited.get(name, 0) for name in BATCH_COUNTERS}

    def restore(self, counters: dict[str, int], *, credited: bool) -> None:
        """Take over the model counters a resumed episode stored with its last turn; its batch
        counts them already (`credited`) if that attempt ended, not if its worker died."""
        for name in EPISODE_COUNTERS:
            setattr(self, name, int(counters.get(name, 0)))
        self.credited = self.batch_counters() if credited else {}

    def live_fields(self) -> dict[str, int]:
        """What the episode's row shows while it plays: its step and its model counters."""
        return {"steps": self.steps, **{name: getattr(self, name) for name in EPISODE_COUNTERS}}

    def add_decision(self, decision: Decision) -> None:
        self.tool_calls += len(decision.tool_calls)
        self.model_calls += int(decision.model_called)
        self.model_retries += decision.retries
        self.prompt_tokens += decision.prompt_tokens
        self.completion_tokens += decision.completion_tokens
        if decision.call_failed:
            self.model_errors += 1
        elif decision.error_kind:
            self.bad_outputs += 1

    def as_fields(self) -> dict[str, object]:
        return {
            "steps": self.steps,
            "total_reward": self.total_reward,
            "achievements": self.achievements,
            "achievement_count": len(self.achievements),
            "tool_calls": self.tool_calls,
            "model_calls": self.model_calls,
            "model_errors": self.model_errors,
            "model_retries": self.model_retries,
            "bad_outputs": self.bad_outputs,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
        }
