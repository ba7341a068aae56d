"""Plays one episode with a policy and records every frame and turn.

Rows are written in chunks, each chunk in one transaction that also renews the episode's
claim: a worker that lost its claim (presumed dead, then re-claimed by another) stops at its
next chunk instead of writing beside the new owner. A baseline's chunks are
`STUDIO_RECORD_CHUNK` turns, written by a thread of its own while it plays on. A model
episode's turns are paid for: each is written as it is played, with the episode's step and
counters, so that what a crash, a kill or a cancel leaves is counted, reviewable, and resumed
from (`ResumePoint`) instead of paid for again.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from django.conf import settings as django_settings
from django.db import connection, connections, transaction

from rollouts.game.crafter_env import ACTION_INDEX, StudioEnv, encode_png, text_observation
from rollouts.jobs import EPISODE
from rollouts.models import Episode, Frame, Turn
from rollouts.policies.base import (
    Decision,
    Observation,
    PastTurn,
    Policy,
    PolicyUnavailable,
)
from rollouts.recording import sent_calls
from rollouts.recording.frame_store import FrameStore, frame_name
from rollouts.rollout_settings import RolloutSettings
from studio.claims import ClaimCheck, ClaimLost, job_heartbeat
from studio.outages import waited_out
from studio.row_copy import copy_rows
from studio.transactions import commit_without_flush_wait

logger = logging.getLogger(__name__)


class ForkDiverged(Exception):
    """A fork's replay did not give the original's frames: determinism is guarded, not assumed."""


class ResumeDiverged(Exception):
    """Replaying an episode's own recorded turns did not give its stored frames: it must start
    over (and says so), never play on from a game that is not the one recorded."""


class EpisodeCanceled(Exception):
    """The episode's batch was canceled: what it played is written, it stops before its next
    model call, and its service ends it as canceled.

    `decision`: raised between two tries of a call, what the tries before it sent."""

    decision: Decision | None = None


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
        resume: ResumePoint | None = None,
        end: Callable[[EpisodeTotals], bool] | None = None,
        unsettled: dict[str, int] | None = None,
        priced: bool = False,
    ) -> None:
        self.episode = episode
        # Ends the episode (False: its claim was lost) in the transaction of its last rows,
        # once it has been played to the end: one commit instead of two, one claim check.
        self.end = end
        self.prefix = prefix
        # Record the fork's replayed prefix and stop (a person plays on in the browser).
        self.prefix_only = prefix_only
        self.resume = resume
        self.settings = settings
        self.policy = policy
        self.claim_token = claim_token
        # Each frame's file is written while the episode waits for its next answer.
        self.store = store or FrameStore(write_ahead=True)
        self.chunk = max(1, django_settings.STUDIO_RECORD_CHUNK)
        # A model episode's turns are written as they happen (see the module's docstring).
        self.live = bool(getattr(policy, "calls_model", False))
        self.totals = EpisodeTotals()
        if resume is not None:
            self.totals.restore(resume.counters, credited=resume.credited)
        # Requests an earlier attempt sent and never wrote a turn for (`sent_calls`): paid
        # for, so counted, though their answers (and tokens) died with that worker.
        for name, value in (unsettled or {}).items():
            setattr(self.totals, name, getattr(self.totals, name) + value)
        # An endpoint with prices has each turn written as soon as it is decided: a kill then
        # asks again only the call that was in flight, whatever the calls' latency.
        self.priced = priced
        self._frames: list[Frame] = []
        self._turns: list[Turn] = []
        self._writing: Future[None] | None = None
        # Chunks are written on a thread of their own only in autocommit mode: inside a
        # caller's transaction (tests, a caller's atomic block) they must join it.
        self._background = not connection.in_atomic_block
        self._writer: ThreadPoolExecutor | None = None
        # Set by a write that found the batch canceled: the episode stops at its next turn.
        self._canceled = False
        self._claim_check: ClaimCheck | None = None
        self._written_at = time.monotonic()

    def play(self) -> EpisodeTotals:
        # While it plays, this process renews the episode's claim every few seconds, however
        # long a model call takes: a worker that stops doing so is presumed dead within
        # STUDIO_EPISODE_STALE_SECONDS and its episodes are taken over. (Inside a caller's
        # transaction the keeper's own connection would not see the claim.)
        claim = EPISODE.held(self.episode.id, self.claim_token)
        with claim.kept() if self._background else contextlib.nullcontext():
            try:
                return self._play()
            except (ClaimLost, ForkDiverged, ResumeDiverged):
                # A diverged replay writes nothing: the fork's prefix is never flushed before
                # it has been checked whole.
                self.store.discard_staged()
                raise
            except EpisodeCanceled:
                raise  # what it played is written already
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
        if self.resume is not None:
            frame, png, turn_index, done = self._replay_recorded(env, frame, png, history, unlocked)
        elif self.prefix is not None:
            frame, png, turn_index, done = self._replay_prefix(env, frame, png, history, unlocked)
        if self.prefix_only:
            self.flush(final=True)
            return self.totals
        self._claim_check = EPISODE.held(episode.id, self.claim_token).checked(CLAIM_CHECK_SECONDS)
        if self.live and hasattr(self.policy, "before_retry"):
            self.policy.before_retry = self._check_claim
        if self.live and hasattr(self.policy, "on_send"):
            key = sent_calls.episode_key(episode.id, batch_created_at=episode.batch.created_at)
            self.policy.on_send = lambda retry: sent_calls.count_sent(key, retry=retry)
        while not done and not self._canceled:
            if self.live:
                # Cancel marks the episode: a model episode stops before its next paid call,
                # not at its next chunk. At most one read a second, so a batch of short
                # calls does not pay a query for each.
                try:
                    self._check_claim()
                except EpisodeCanceled:
                    self._canceled = True
                    break
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
            decision = self._decide(observation)
            if decision is None:  # canceled between two tries of a call
                break
            actions = decision.actions or ([] if decision.end_episode else ["noop"])
            executed, reward, new_unlocks, next_frame, next_png, done = self._execute(
                env, actions, frame, png, unlocked
            )
            self._turns.append(
                self._turn(turn_index, frame, observation, decision, executed, reward, new_unlocks)
            )
            history.append(PastTurn(frame_step=frame.step, png=png, actions=tuple(executed)))
            frame, png = next_frame, next_png
            turn_index += 1
            if decision.end_episode:
                done = True
            if done:
                break
            if len(self._turns) >= self.chunk or (self.live and self._live_write_due()):
                self.flush()
        if self._canceled:
            # Written with the claim it still holds (the batch's cancel leaves it to this
            # worker): the service then ends it as canceled.
            self.flush(final=True)
            raise EpisodeCanceled(f"episode {episode.id}: its batch was canceled")
        self.flush(final=True, end=self.end)
        if self._canceled:  # canceled while its last rows were on their way
            raise EpisodeCanceled(f"episode {episode.id}: its batch was canceled")
        return self.totals

    def _decide(self, observation: Observation) -> Decision | None:
        """The policy's decision, counted; None when a cancel stopped it between two tries of
        a call. The calls of a decision that gave up (or was stopped) are counted too."""
        try:
            decision = self.policy.decide(observation)
        except EpisodeCanceled as exc:  # between two tries of a call: no more tries
            if exc.decision is not None:  # the tries before it were sent: counted
                self.totals.add_decision(exc.decision)
            self._canceled = True
            return None
        except PolicyUnavailable as exc:
            if exc.decision is not None:  # its calls were made: counted all the same
                self.totals.add_decision(exc.decision)
            raise
        self.totals.add_decision(decision)
        return decision

    def _turn(
        self,
        index: int,
        frame: Frame,
        observation: Observation,
        decision: Decision,
        executed: list[str],
        reward: float,
        unlocks: list[str],
    ) -> Turn:
        """The row of a turn played: what the policy saw and answered, what was executed."""
        return Turn(
            episode=self.episode,
            index=index,
            frame=frame,
            observation_text=observation.text,
            request_messages=decision.request_messages,
            model_text=decision.model_text,
            reasoning_text=decision.reasoning_text,
            tool_calls=decision.tool_calls,
            actions=executed,
            reward=reward,
            achievements_unlocked=unlocks,
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

    def _live_write_due(self) -> bool:
        """A model episode writes its turns as they are played: at once when its calls take
        `STUDIO_LIVE_WRITE_SECONDS` or more (as a real model's do), else at most that often
        (a local server answering in milliseconds would otherwise pay a transaction a turn).
        With prices, every turn at once (`priced`): a turn not written is asked again."""
        now = time.monotonic()
        if self.priced:
            self._written_at = now
            return True
        if now - self._written_at < django_settings.STUDIO_LIVE_WRITE_SECONDS:
            return False
        self._written_at = now
        return True

    def _check_claim(self) -> None:
        """ClaimLost once another worker has the episode, EpisodeCanceled once its batch was
        canceled; read at most every CLAIM_CHECK_SECONDS, waiting while the database cannot
        be reached (no call is made that a cancel might have forbidden)."""
        if self._claim_check is None:
            self._claim_check = EPISODE.held(self.episode.id, self.claim_token).checked(
                CLAIM_CHECK_SECONDS
            )
        if self._claim_check.status() == Episode.Status.CANCELED:
            raise EpisodeCanceled(f"episode {self.episode.id}: its batch was canceled")

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
        step = env.step_count
        if self.resume is not None and step <= self.resume.stored_through:
            return self._stored_frame(env, step, encoded), encoded.png
        sha256, name = self.store.stage(encoded.png)
        frame = Frame(
            episode=self.episode,
            step=step,
            sha256=sha256,
            image=name,
            width=encoded.width,
            height=encoded.height,
            state=env.state(),
        )
        self._frames.append(frame)
        return frame, encoded.png

    def _stored_frame(self, env: StudioEnv, step: int, encoded) -> Frame:
        """A replayed frame whose row exists: checked against it, not written again."""
        assert self.resume is not None
        sha256 = hashlib.sha256(encoded.png).hexdigest()
        stored = self.resume.frames.get(step)
        if stored is None or stored[1] != sha256:
            raise ResumeDiverged(
                f"the replayed frame at step {step} has sha256 {sha256}, the stored one "
                + (f"has {stored[1]}" if stored else "is missing")
            )
        return Frame(
            id=stored[0],
            episode=self.episode,
            step=step,
            sha256=sha256,
            image=frame_name(sha256),
            width=encoded.width,
            height=encoded.height,
            state=env.state(),
        )

    def flush(
        self, *, final: bool = False, end: Callable[[EpisodeTotals], bool] | None = None
    ) -> None:
        """Write the pending frames and turns, after the chunk before them.

        While the episode plays on, chunks go to a writer thread (started at the first
        one, so that short episodes never pay for a thread and its database connection);
        the final chunk is written here, once the writer is done, and with `end` it ends the
        episode in the same transaction.
        """
        chunk = (self.store.take_staged(), self._frames, self._turns, self.totals.live_fields())
        self._frames, self._turns = [], []
        self._wait_for_writer()
        # A model episode writes its turn here, between two calls, on its own connection: a
        # writer thread would open a connection of its own for each episode (a 5-turn episode
        # paid more for that than for its rows).
        if final or not self._background or self.live:
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
        live: dict[str, int],
        *,
        end: Callable[[EpisodeTotals], bool] | None = None,
    ) -> None:
        """Write one chunk (files first, so no row names a missing file), retried while the
        database is unreachable; a chunk whose commit was lost with the connection, but
        made it, is not written twice."""
        self.store.write_many(files)
        waited_out(
            lambda: self._write_rows(frames, turns, live, end=end),
            what=f"episode {self.episode.id}",
            seconds=django_settings.STUDIO_DATABASE_OUTAGE_SECONDS,
            landed=lambda: self._landed(frames, turns, end),
        )

    def _landed(self, frames: list[Frame], turns: list[Turn], end) -> bool:
        """Whether a chunk whose commit failed with its connection was committed after all
        (its last row is there, or, for an end alone, the episode is finished)."""
        episode = self.episode.id
        if turns:
            written = Turn.objects.filter(episode_id=episode, index=turns[-1].index)
        elif frames:
            written = Frame.objects.filter(episode_id=episode, step=frames[-1].step)
        elif end is not None:
            written = Episode.objects.filter(
                id=episode, claim_token=self.claim_token, status=Episode.Status.FINISHED
            )
        else:
            return False
        return written.exists()

    def _write_rows(
        self,
        frames: list[Frame],
        turns: list[Turn],
        live: dict[str, int],
        *,
        end: Callable[[EpisodeTotals], bool] | None = None,
    ) -> None:
        with transaction.atomic():
            # Turns lost in a database crash (not a restart: that flushes) are played again,
            # from the last turn on disk: at most the last fraction of a second's calls.
            commit_without_flush_wait()
            if end is None:
                self._renew(live)
            copy_rows(frames, turns)  # COPY on PostgreSQL: rows written on every step
            # The end checks the claim as the renewal does; a lost one undoes the rows.
            if end is not None and not end(self.totals):
                if not self._canceled_here():
                    raise ClaimLost(f"episode {self.episode.id} was claimed by another worker")
                self._renew(live)  # the rows stay, the service ends it as canceled

    def _renew(self, live: dict[str, int]) -> None:
        """Renew the claim with the episode's step and counters; a canceled episode's rows are
        still written (its worker holds the claim until it stops), then it stops."""
        if EPISODE.renew(self.episode.id, self.claim_token, **live):
            return
        canceled = job_heartbeat(
            model=Episode,
            pk=self.episode.id,
            token=self.claim_token,
            working=Episode.Status.CANCELED,
            **live,
        )
        if not canceled:
            raise ClaimLost(f"episode {self.episode.id} was claimed by another worker")
        self._canceled = True

    def _canceled_here(self) -> bool:
        return Episode.objects.filter(
            id=self.episode.id, claim_token=self.claim_token, status=Episode.Status.CANCELED
        ).exists()
