"""Replaying what was recorded before playing on: an episode's own turns when it resumes
(`ResumePoint`), an original's prefix when it is a fork (`ForkPrefix`). Every replayed frame
is checked against its stored sha256: determinism is guarded, not assumed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from rollouts.game.crafter_env import StudioEnv, text_observation
from rollouts.models import Frame, Turn
from rollouts.policies.base import (
    PastTurn,
)


class ForkDiverged(Exception):
    """A fork's replay did not give the original's frames: determinism is guarded, not assumed."""


class ResumeDiverged(Exception):
    """Replaying an episode's own recorded turns did not give its stored frames: it must start
    over (and says so), never play on from a game that is not the one recorded."""


# Fields of an original turn that a fork's replayed prefix copies: what was decided, and how.
FORK_COPIED_FIELDS = (
    "observation_text",
    "request_messages",
    "model_text",
    "reasoning_text",
    "tool_calls",
    "error",
    "error_kind",
    "finish_reason",
    "text_fallback",
    "prompt_tokens",
    "completion_tokens",
    "latency_ms",
    "retries",
    "truncated",
)


@dataclass(frozen=True)
class ForkPrefix:
    """What a fork replays: the original's turns before the fork point and its frame hashes.

    `turns` are the original's turns 0..K-1 (FORK_COPIED_FIELDS plus "actions"); every frame
    the replay produces up to `fork_step` must have the sha256 in `frame_sha256` for its step.
    `correction`, when set, is played as turn K (a person's corrected actions).
    """

    source_episode_id: int
    turns: list[dict]
    frame_sha256: dict[int, str]
    fork_step: int
    correction: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ResumePoint:
    """Where an episode whose worker died (or that was stopped) goes on from: its own recorded
    turns' actions, replayed, and its stored frames (step -> (id, sha256)) that the replay must
    give again, through `stored_through`; `counters` are its model counters as stored with its
    last written turn (already counted on the batch)."""

    actions: list[list[str]]
    frames: dict[int, tuple[int, str]]
    stored_through: int
    counters: dict[str, int]
    # Whether the batch counts `counters` already (the attempt before ended, as failed or
    # canceled, and is resumed on request), or not (its worker died).
    credited: bool = False


class Replaying:
    """`EpisodeRecorder`'s replays (its attributes: `episode`, `prefix`, `resume`, `store`,
    `totals`, and its `_execute`, `_add_frame`, `flush`)."""

    def _check_replayed(self, frame: Frame) -> None:
        assert self.prefix is not None
        expected = self.prefix.frame_sha256.get(frame.step)
        if expected != frame.sha256:
            source = self.prefix.source_episode_id
            raise ForkDiverged(
                f"fork diverged: the replayed frame at step {frame.step} has sha256 "
                f"{frame.sha256}, episode {source}'s "
                + (f"has {expected}" if expected else "is missing")
            )

    def _replay_recorded(
        self,
        env: StudioEnv,
        frame: Frame,
        png: bytes,
        history: deque[PastTurn],
        unlocked: set[str],
    ) -> tuple[Frame, bytes, int, bool]:
        """Replay the episode's own recorded turns (their rows exist: nothing is written,
        every frame is checked against its stored sha256 in `_add_frame`), rebuilding what the
        model is shown of the past (history frames, earlier actions). No call is made."""
        assert self.resume is not None
        done = False
        for index, actions in enumerate(self.resume.actions):
            if done:
                raise ResumeDiverged(
                    f"the replayed game ended at turn {index - 1}, before its recorded turns did"
                )
            executed, _, _, next_frame, next_png, done = self._execute(
                env, list(actions), frame, png, unlocked
            )
            if executed != list(actions):
                raise ResumeDiverged(f"turn {index} replayed {executed}, recorded {actions}")
            history.append(PastTurn(frame_step=frame.step, png=png, actions=tuple(executed)))
            frame, png = next_frame, next_png
        if frame.step != self.resume.stored_through:
            raise ResumeDiverged(
                f"the replay reached step {frame.step}; frames are stored through step "
                f"{self.resume.stored_through}"
            )
        return frame, png, len(self.resume.actions), done

    def _replay_prefix(
        self,
        env: StudioEnv,
        frame: Frame,
        png: bytes,
        history: deque[PastTurn],
        unlocked: set[str],
    ) -> tuple[Frame, bytes, int, bool]:
        """Replay the original's turns before the fork point, then the correction if any.

        Nothing is written here: the replay is checked whole (every frame's sha256 against
        the original's) before the first chunk goes out. Frames are stored by sha256, so the
        prefix adds rows but no image files. Its model calls were the original's: not counted.
        """
        assert self.prefix is not None
        self._check_replayed(frame)
        done = False
        index = 0
        for index, source in enumerate(self.prefix.turns):
            if done:
                raise ForkDiverged(
                    f"fork diverged: the replayed game ended at turn {index - 1}, before the fork"
                )
            copied = {name: source[name] for name in FORK_COPIED_FIELDS}
            frame, png, done = self._replay_turn(
                env, source["actions"], frame, png, unlocked, history, index=index, **copied
            )
        turn_index = len(self.prefix.turns)
        if frame.step != self.prefix.fork_step:
            raise ForkDiverged(
                f"fork diverged: the replay reached step {frame.step}, the fork point is step "
                f"{self.prefix.fork_step}"
            )
        if self.prefix.correction and not done:
            # A person chose these actions: the turn carries no model text.
            frame, png, done = self._replay_turn(
                env,
                self.prefix.correction,
                frame,
                png,
                unlocked,
                history,
                index=turn_index,
                observation_text=text_observation(env),
                model_text=None,
            )
            turn_index += 1
        return frame, png, turn_index, done

    def _replay_turn(
        self,
        env: StudioEnv,
        actions,
        frame: Frame,
        png: bytes,
        unlocked: set[str],
        history: deque[PastTurn],
        *,
        index: int,
        **fields,
    ) -> tuple[Frame, bytes, bool]:
        """Play one turn of the prefix and keep its row (with `fields`) for the first chunk:
        the next frame, its PNG, and whether the game ended."""
        executed, reward, new_unlocks, next_frame, next_png, done = self._execute(
            env, list(actions), frame, png, unlocked
        )
        self._turns.append(
            Turn(
                episode=self.episode,
                index=index,
                frame=frame,
                actions=executed,
                reward=reward,
                achievements_unlocked=new_unlocks,
                **fields,
            )
        )
        history.append(PastTurn(frame_step=frame.step, png=png, actions=tuple(executed)))
        return next_frame, next_png, done
