"""Plays one episode with a policy and records every frame and turn, in chunks.

Rows are written in chunks of `STUDIO_RECORD_CHUNK` turns, each chunk in one transaction
that also renews the episode's claim: a worker that lost its claim (presumed dead, then
re-claimed by another) stops at its next chunk instead of writing beside the new owner.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from django.conf import settings as django_settings
from django.db import connection, connections, transaction

from rollouts.game.crafter_env import ACTION_INDEX, StudioEnv, encode_png, text_observation
from rollouts.models import Episode, Frame, Turn
from rollouts.policies.base import Decision, Observation, PastTurn, Policy
from rollouts.recording.frame_store import FrameStore
from rollouts.rollout_settings import RolloutSettings
from studio import claims
from studio.claims import ClaimLost
from studio.row_copy import copy_rows
from studio.transactions import commit_without_flush_wait

logger = logging.getLogger(__name__)


class ForkDiverged(Exception):
    """A fork's replay did not give the original's frames: determinism is guarded, not assumed."""


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


# How often a model episode makes sure, before its next call, that it still holds its claim.
CLAIM_CHECK_SECONDS = 1.0


class EpisodeRecorder:
    def __init__(
        self,
        *,
        episode: Episode,
        settings: RolloutSettings,
        policy: Policy,
        claim_token: str,
        store: FrameStore | None = None,
        prefix: ForkPrefix | None = None,
        prefix_only: bool = False,
        end: Callable[[EpisodeTotals], bool] | None = None,
    ) -> None:
        self.episode = episode
        # Ends the episode (False: its claim was lost) in the transaction of its last rows,
        # once it has been played to the end: one commit instead of two, one claim check.
        self.end = end
        self.prefix = prefix
        # Record the fork's replayed prefix and stop (a person plays on in the browser).
        self.prefix_only = prefix_only
        self.settings = settings
        self.policy = policy
        self.claim_token = claim_token
        # Each frame's file is written while the episode waits for its next answer.
        self.store = store or FrameStore(write_ahead=True)
        self.chunk = max(1, django_settings.STUDIO_RECORD_CHUNK)
        self.totals = EpisodeTotals()
        self._frames: list[Frame] = []
        self._turns: list[Turn] = []
        self._writing: Future[None] | None = None
        # Chunks are written on a thread of their own only in autocommit mode: inside a
        # caller's transaction (tests, a caller's atomic block) they must join it.
        self._background = not connection.in_atomic_block
        self._writer: ThreadPoolExecutor | None = None

    def play(self) -> EpisodeTotals:
        try:
            return self._play()
        except (ClaimLost, ForkDiverged):
            # A diverged replay writes nothing: the fork's prefix is never flushed before
            # it has been checked whole.
            self.store.discard_staged()
            raise
        except BaseException:
            self._save_what_was_played()
            raise
        finally:
            self._close_writer()

    def _save_what_was_played(self) -> None:
        """On failure, keep the turns played so far: they show reviewers how it failed."""
        try:
            self.flush(final=True)
        except Exception:
            logger.exception("episode %s: could not save its last turns", self.episode.id)

    def _play(self) -> EpisodeTotals:
        settings, episode = self.settings, self.episode
        env = StudioEnv(seed=int(episode.seed), size=settings.image_size, length=settings.steps)
        try:
            return self._play_on(env)
        finally:
            env.close()  # its world is freed now, not by the cyclic collector (`close`)

    def _play_on(self, env: StudioEnv) -> EpisodeTotals:
        settings, episode = self.settings, self.episode
        frame, png = self._add_frame(env, env.reset())
        # When the steps start (the game is built and reset): `benchmarks/rollout_throughput`
        # times the steps from here, as it times stock crafter's after its `reset()`.
        logger.debug(
            "episode %s: reset, playing", episode.id, extra={"steps_started": time.perf_counter()}
        )
        history: deque[PastTurn] = deque(maxlen=max(settings.history_frames, 1))
        unlocked: set[str] = set()
        done = False
        turn_index = 0
        if self.prefix is not None:
            frame, png, turn_index, done = self._replay_prefix(env, frame, png, history, unlocked)
        if self.prefix_only:
            self.flush(final=True)
            return self.totals
        claim_checked = time.monotonic()
        while not done:
            if getattr(self.policy, "calls_model", False):
                # Cancel withdraws the claim: a model episode stops before its next paid call,
                # not at its next chunk (up to 64 calls later). At most one read a second, so
                # a batch of short calls does not pay a query for each.
                claim_checked = self._still_claimed(claim_checked)
            observation = Observation(
                seed=int(episode.seed),
                turn=turn_index,
                step=env.step_count,
                step_limit=settings.steps,
                text=text_observation(env, frame.state),
                frame_step=frame.step,
                png=png,
                history=tuple(history) if settings.history_frames else (),
            )
            decision = self.policy.decide(observation)
            self.totals.add_decision(decision)
            actions = decision.actions or ([] if decision.end_episode else ["noop"])
            executed, reward, new_unlocks, next_frame, next_png, done = self._execute(
                env, actions, frame, png, unlocked
            )
            self._turns.append(
                Turn(
                    episode=episode,
                    index=turn_index,
                    frame=frame,
                    observation_text=observation.text,
                    request_messages=decision.request_messages,
                    model_text=decision.model_text,
                    reasoning_text=decision.reasoning_text,
                    tool_calls=decision.tool_calls,
                    actions=executed,
                    reward=reward,
                    achievements_unlocked=new_unlocks,
                    error=decision.error,
                    error_kind=decision.error_kind,
                    finish_reason=decision.finish_reason,
                    text_fallback=decision.text_fallback,
                    prompt_tokens=decision.prompt_tokens,
                    completion_tokens=decision.completion_tokens,
                    latency_ms=decision.latency_ms,
                    retries=decision.retries,
                    truncated=decision.truncated,
                )
            )
            history.append(PastTurn(frame_step=frame.step, png=png, actions=tuple(executed)))
            frame, png = next_frame, next_png
            turn_index += 1
            if decision.end_episode:
                done = True
            if len(self._turns) >= self.chunk:
                self.flush()
        self.flush(final=True, end=self.end)
        return self.totals

    def _still_claimed(self, checked: float) -> float:
        """When the claim was last seen held; ClaimLost once it is not (canceled, taken over)."""
        now = time.monotonic()
        if now - checked < CLAIM_CHECK_SECONDS:
            return checked
        if not Episode.objects.filter(id=self.episode.id, claim_token=self.claim_token).exists():
            raise ClaimLost(f"episode {self.episode.id} is no longer this worker's (canceled?)")
        return now

    def _execute(
        self, env: StudioEnv, actions: list[str], frame: Frame, png: bytes, unlocked: set[str]
    ) -> tuple[list[str], float, list[str], Frame, bytes, bool]:
        """Run a turn's actions in order, stopping when the game ends."""
        executed: list[str] = []
        reward = 0.0
        new_unlocks: list[str] = []
        done = False
        for action in actions:
            pixels, step_reward, done, info = env.step(ACTION_INDEX[action])
            executed.append(action)
            reward += float(step_reward)
            for name, count in info["achievements"].items():
                if count > 0 and name not in unlocked:
                    unlocked.add(name)
                    new_unlocks.append(name)
                    self.totals.achievements[name] = env.step_count
            frame, png = self._add_frame(env, pixels)
            if self.prefix is not None and frame.step <= self.prefix.fork_step:
                self._check_replayed(frame)
            if done:
                break
        self.totals.steps = env.step_count
        self.totals.total_reward += reward
        return executed, reward, new_unlocks, frame, png, done

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
            executed, reward, new_unlocks, next_frame, next_png, done = self._execute(
                env, list(source["actions"]), frame, png, unlocked
            )
            self._turns.append(
                Turn(
                    episode=self.episode,
                    index=index,
                    frame=frame,
                    actions=executed,
                    reward=reward,
                    achievements_unlocked=new_unlocks,
                    **{name: source[name] for name in FORK_COPIED_FIELDS},
                )
            )
            history.append(PastTurn(frame_step=frame.step, png=png, actions=tuple(executed)))
            frame, png = next_frame, next_png
        turn_index = len(self.prefix.turns)
        if frame.step != self.prefix.fork_step:
            raise ForkDiverged(
                f"fork diverged: the replay reached step {frame.step}, the fork point is step "
                f"{self.prefix.fork_step}"
            )
        if self.prefix.correction and not done:
            observation = text_observation(env)
            executed, reward, new_unlocks, next_frame, next_png, done = self._execute(
                env, list(self.prefix.correction), frame, png, unlocked
            )
            # A person chose these actions: the turn carries no model text.
            self._turns.append(
                Turn(
                    episode=self.episode,
                    index=turn_index,
                    frame=frame,
                    observation_text=observation,
                    model_text=None,
                    actions=executed,
                    reward=reward,
                    achievements_unlocked=new_unlocks,
                )
            )
            history.append(PastTurn(frame_step=frame.step, png=png, actions=tuple(executed)))
            frame, png = next_frame, next_png
            turn_index += 1
        return frame, png, turn_index, done

    def _add_frame(self, env: StudioEnv, pixels) -> tuple[Frame, bytes]:
        encoded = encode_png(pixels)
        sha256, name = self.store.stage(encoded.png)
        frame = Frame(
            episode=self.episode,
            step=env.step_count,
            sha256=sha256,
            image=name,
            width=encoded.width,
            height=encoded.height,
            state=env.state(),
        )
        self._frames.append(frame)
        return frame, encoded.png

    def flush(
        self, *, final: bool = False, end: Callable[[EpisodeTotals], bool] | None = None
    ) -> None:
        """Write the pending frames and turns, after the chunk before them.

        While the episode plays on, chunks go to a writer thread (started at the first
        one, so that short episodes never pay for a thread and its database connection);
        the final chunk is written here, once the writer is done, and with `end` it ends the
        episode in the same transaction.
        """
        chunk = (self.store.take_staged(), self._frames, self._turns, self.totals.steps)
        self._frames, self._turns = [], []
        self._wait_for_writer()
        if final or not self._background:
            try:
                self._write_chunk(*chunk, end=end)
            except ClaimLost:
                raise
            except BaseException:
                if end is not None:
                    # The end failed and took the last rows with it: they are pending again,
                    # so that saving what was played (`play`) writes them, without the end.
                    self.store.stage_again(chunk[0])
                    self._frames, self._turns = chunk[1] + self._frames, chunk[2] + self._turns
                raise
            return
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="episode-writer")
        self._writing = self._writer.submit(self._write_chunk, *chunk)

    def _wait_for_writer(self) -> None:
        if self._writing is not None:
            writing, self._writing = self._writing, None
            writing.result()

    def _close_writer(self) -> None:
        if self._writer is None:
            return
        try:
            self._wait_for_writer()
        finally:
            # The writer thread's own database connection must not outlive it.
            self._writer.submit(connections.close_all).result()
            self._writer.shutdown(wait=True)
            self._writer = None

    def _write_chunk(
        self,
        files: list[tuple[str, bytes]],
        frames: list[Frame],
        turns: list[Turn],
        steps: int,
        *,
        end: Callable[[EpisodeTotals], bool] | None = None,
    ) -> None:
        """Write one chunk and renew the claim (or, with `end`, end the episode); files
        first, so no row names a missing file."""
        self.store.write_many(files)
        with transaction.atomic():
            # A chunk lost in a database crash costs nothing: an episode that did not end is
            # replayed from the start. So don't wait for the WAL flush on every chunk.
            commit_without_flush_wait()
            if end is None:
                renewed = claims.job_heartbeat(
                    model=Episode, pk=self.episode.id, token=self.claim_token, steps=steps
                )
                if not renewed:
                    raise ClaimLost(f"episode {self.episode.id} was claimed by another worker")
            copy_rows(frames, turns)  # COPY on PostgreSQL: rows written on every step
            # The end checks the claim as the heartbeat does; a lost one undoes the rows.
            if end is not None and not end(self.totals):
                raise ClaimLost(f"episode {self.episode.id} was claimed by another worker")
