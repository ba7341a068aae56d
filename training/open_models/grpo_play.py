"""What a GRPO run (`training.open_models.grpo`) and the studio's episode player agree on.

Django-free. The trainer asks a `Player` to play one iteration's episodes with the model
being trained; each episode's policy holds its own `EpisodeModel` (the trainer's model, as one
episode's turns see it: each user turn is added to the episode's conversation and the model
answers it, its tokens kept for the update). The player records every episode as the studio
records any other (frames, turns, tool calls, achievements) and returns what the reward
needs; the trainer scores them, updates the model, and gives each episode its advantage
through the `GrpoSink`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


class EpisodeModel(Protocol):
    """One episode's view of the model being trained (`training.open_models.grpo_turns`)."""

    def reply(self, content: list[dict[str, Any]]) -> str:
        """Add a user turn and answer it; `content` holds `{"type": "text", "text": ...}` and
        `{"type": "image", "image": <PIL.Image>}` parts, in order. Returns the answer's text
        (the model's own words with its special tokens, such as `<tool_call>`, but
        not its end of turn). The first call also renders the
        system turn (the studio's system prompt and tool block)."""
        ...


@dataclass(frozen=True)
class PlayedEpisode:
    """One recorded episode, as the reward and the trainer need it."""

    seed: int
    member: int  # its sample index: which member of its seed's group
    episode_id: int | None  # the studio's `rollouts.Episode` (None in Django-free tests)
    model: EpisodeModel  # the EpisodeModel that played it (its tokens are the update's)
    crafter_reward: float  # crafter's own reward, summed over the episode
    achievements: tuple[str, ...]  # the achievements unlocked, each once
    actions: tuple[tuple[str, ...], ...]  # the actions executed, per turn


class IterationCanceled(Exception):
    """Cancel was asked while an iteration was being played: the run stops there."""


class Player(Protocol):
    def play(
        self,
        *,
        iteration: int,
        checkpoint_step: int,
        episodes: Sequence[tuple[int, int]],
        model_for: Callable[[int, int], EpisodeModel],
    ) -> list[PlayedEpisode]:
        """Play and record `episodes` ((seed, member) pairs, in this order) with
        `model_for(seed, member)`, one new EpisodeModel per episode; return them in the same
        order. Raises IterationCanceled when Cancel is asked between episodes."""
        ...


@dataclass(frozen=True)
class ScoredEpisode:
    episode: PlayedEpisode
    reward: float  # the chosen reward (`training.open_models.rewards`)
    advantage: float  # GRPO's, from TRL: the same for every turn of the episode


class GrpoSink(Protocol):
    """Where a GRPO run reports (the train worker writes it into the job's rows)."""

    def event(
        self, type: str, message: str, *, level: str = "info", data: dict | None = None
    ) -> None: ...

    def should_stop(self) -> bool: ...

    def checkpoint_saved(self, step: int, directory: Path) -> None: ...

    def resuming(self, step: int) -> None:
        """The run goes on from the checkpoint of `step`: iterations after it are removed
        (their update was lost) before they are played again."""
        ...

    def iteration_scored(self, iteration: int, scored: list[ScoredEpisode]) -> None:
        """Every episode of `iteration` has its reward and advantage (before the update)."""
        ...

    def iteration_logged(self, iteration: int, *, loss: float | None, kl: float | None) -> None:
        """What the trainer logged for `iteration`'s update (its step)."""
        ...
