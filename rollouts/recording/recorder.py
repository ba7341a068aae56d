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
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from django.conf import settings as django_settings
from django.db import connection

from rollouts.game.crafter_env import ACTION_INDEX, StudioEnv, text_observation
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
from rollouts.recording.frame_store import FrameStore
from rollouts.recording.replay import (
    FORK_COPIED_FIELDS,
    ForkDiverged,
    ForkPrefix,
    Replaying,
    ResumeDiverged,
    ResumePoint,
)
from rollouts.recording.totals import (
    BATCH_COUNTERS,
    EPISODE_COUNTERS,
    EpisodeTotals,
    batch_counters_of,
)
from rollouts.recording.writer import Writing
from rollouts.rollout_settings import RolloutSettings
from studio.claims import ClaimCheck, ClaimLost

logger = logging.getLogger(__name__)

# What other modules read from here: a recorder's exceptions, replays and totals.
__all__ = [
    "BATCH_COUNTERS",
    "CLAIM_CHECK_SECONDS",
    "EPISODE_COUNTERS",
    "FORK_COPIED_FIELDS",
    "EpisodeCanceled",
    "EpisodeRecorder",
    "EpisodeTotals",
    "ForkDiverged",
    "ForkPrefix",
    "ResumeDiverged",
    "ResumePoint",
    "batch_counters_of",
]


class EpisodeCanceled(Exception):
    """The episode's batch was canceled: what it played is written, it stops before its next
    model call, and its service ends it as canceled.

    `decision`: raised between two tries of a call, what the tries before it sent."""

    decision: Decision | None = None


# How often a model episode makes sure, before its next call, that it still holds its claim.
CLAIM_CHECK_SECONDS = 1.0


class EpisodeRecorder(Replaying, Writing):
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
