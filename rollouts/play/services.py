"""Writes for human play: a person's game is an ordinary episode of policy `human`.

Each key press is one turn of one action, recorded as it happens (frame, turn, episode
totals), so nothing is lost when the game's in-memory state is. That state lives between
key presses as a pickled snapshot in Django's cache, keyed by the number of turns recorded:
a snapshot that is missing (cache flushed, another process, a restart) or behind (another
process played on) is never used; the game is rebuilt by replaying the recorded actions,
and the rebuilt frame is checked against the stored one's sha256.

A key press names the turn it is for: a double-sent key finds that turn already recorded
and records nothing. Key presses of one game are serialised by a row lock on the episode.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field

from django.core.cache import cache
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from rollouts.game.crafter_env import ACTION_INDEX, StudioEnv, encode_png, text_observation
from rollouts.models import Episode, Frame, RolloutBatch, Turn
from rollouts.recording import services
from rollouts.recording.frame_store import FrameStore
from rollouts.recording.recorder import EpisodeTotals
from rollouts.rollout_settings import RolloutSettings, SettingsError
from studio.transactions import commit_without_flush_wait

HUMAN = RolloutBatch.Policy.HUMAN.value
SNAPSHOT_SECONDS = 6 * 3600


class PlayError(ValueError):
    """The key press cannot be played; the message says why, in one line."""


@dataclass
class PlaySnapshot:
    """Everything a key press needs beyond the database: the game and the frame it shows."""

    env: StudioEnv
    frame_id: int
    frame_step: int
    unlocked: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class PlayResult:
    episode: Episode
    frame: Frame
    turns: int
    duplicate: bool = False
    reward: float = 0.0
    unlocked: tuple[str, ...] = ()


def _snapshot_key(episode_id: int, turns: int) -> str:
    return f"studio:play:{episode_id}:{turns}"


def play_settings(*, seed: int, steps: int, image_size: int, name: str = "") -> RolloutSettings:
    """The batch options of a human game; raises SettingsError like any batch's options."""
    return RolloutSettings(
        policy=HUMAN, seeds=(seed,), steps=steps, image_size=image_size, name=name
    )


def play_start(*, settings: RolloutSettings, user) -> Episode:
    """A new game: its batch and episode, and frame 0 (the world after `reset()`)."""
    if settings.policy != HUMAN:
        raise SettingsError(f"policy: a game in the browser is played by {HUMAN!r}")
    batch = services.batch_create(settings=settings, created_by=user, enqueue=False)
    episode = batch.episodes.get()
    play_claim(episode=episode)
    env = StudioEnv(seed=int(episode.seed), size=settings.image_size, length=settings.steps)
    pixels = env.reset()
    frame = _frame_store(episode=episode, env=env, pixels=pixels)
    _snapshot_save(episode.id, 0, PlaySnapshot(env=env, frame_id=frame.id, frame_step=0))
    return episode


def play_claim(*, episode: Episode) -> None:
    """Mark a human episode running: it is played by requests, never by a worker."""
    now = timezone.now()
    Episode.objects.filter(id=episode.id).update(
        status=Episode.Status.RUNNING,
        claim_token=f"human-{uuid.uuid4().hex}",
        started_at=now,
        heartbeat_at=now,
        attempts=F("attempts") + 1,
    )
    RolloutBatch.objects.filter(id=episode.batch_id, status=RolloutBatch.Status.PENDING).update(
        status=RolloutBatch.Status.RUNNING, started_at=now
    )
    episode.refresh_from_db()


def play_step(*, episode_id: int, action: str, turn: int) -> PlayResult:
    """Play `action` as turn `turn`; if that turn is already recorded, record nothing."""
    if action not in ACTION_INDEX:
        raise PlayError(f"action: {action!r} is not one of crafter's 17 actions")
    with transaction.atomic():
        # A key press lost in a database crash is asked for again: the page syncs to the
        # turns stored, and the game is rebuilt from them. Don't wait for the WAL flush.
        commit_without_flush_wait()
        episode = _locked_game(episode_id)
        # Read after the lock, in a statement of its own: it sees the turn that the press
        # before this one committed (a subquery of the locking statement would not).
        recorded = _turns_recorded(episode_id)
        if turn != recorded or episode.status != Episode.Status.RUNNING:
            if turn == recorded:
                raise PlayError(f"episode {episode_id} has ended ({episode.status})")
            # A key sent twice (or from a stale tab): the turn it names is already played.
            return PlayResult(
                episode=episode, frame=_last_frame(episode_id), turns=recorded, duplicate=True
            )
        snapshot = _snapshot_load(episode, recorded)
        env = snapshot.env
        observation = text_observation(env)
        pixels, reward, done, info = env.step(ACTION_INDEX[action])
        unlocked = sorted(
            name
            for name, count in info["achievements"].items()
            if count > 0 and name not in snapshot.unlocked
        )
        frame = _frame_store(episode=episode, env=env, pixels=pixels)
        Turn.objects.create(
            episode=episode,
            index=recorded,
            frame_id=snapshot.frame_id,
            observation_text=observation,
            model_text=None,
            actions=[action],
            reward=float(reward),
            achievements_unlocked=unlocked,
        )
        achievements = dict(episode.achievements)
        for name in unlocked:
            achievements[name] = env.step_count
        episode.steps = env.step_count
        episode.total_reward = episode.total_reward + float(reward)
        episode.achievements = achievements
        episode.achievement_count = len(achievements)
        episode.heartbeat_at = timezone.now()
        episode.save(
            update_fields=[
                "steps",
                "total_reward",
                "achievements",
                "achievement_count",
                "heartbeat_at",
            ]
        )
        snapshot.frame_id, snapshot.frame_step = frame.id, frame.step
        snapshot.unlocked.update(unlocked)
        if done:
            _finish(episode)
        else:
            snapshot_after = snapshot
            transaction.on_commit(lambda: _snapshot_save(episode_id, recorded + 1, snapshot_after))
    if done:
        episode.refresh_from_db()  # ended: its status and end time
    return PlayResult(
        episode=episode,
        frame=frame,
        turns=recorded + 1,
        reward=float(reward),
        unlocked=tuple(unlocked),
    )


def play_end(*, episode_id: int) -> Episode:
    """The player stops: the game ends here as a finished episode. Safe to repeat."""
    with transaction.atomic():
        episode = _locked_game(episode_id)
        if episode.status == Episode.Status.RUNNING:
            _finish(episode)
    episode.refresh_from_db()
    return episode


def _locked_game(episode_id: int) -> Episode:
    """The game's episode, locked until the transaction ends: its key presses queue here."""
    episode = (
        Episode.objects.select_for_update(of=("self",)).select_related("batch").get(id=episode_id)
    )
    if episode.batch.policy != HUMAN:
        raise PlayError(f"episode {episode_id} is played by {episode.batch.policy}, not a person")
    return episode


def play_rebuild(*, episode: Episode) -> PlaySnapshot:
    """The game at its last recorded turn, replayed from the seed and the recorded actions.

    The replayed frame must be the stored one, byte for byte (sha256): determinism is
    checked, not assumed.
    """
    batch = episode.batch
    env = StudioEnv(seed=int(episode.seed), size=batch.image_size, length=batch.step_limit)
    pixels = env.reset()
    unlocked: set[str] = set()
    for actions in (
        Turn.objects.filter(episode_id=episode.id)
        .order_by("index")
        .values_list("actions", flat=True)
    ):
        for action in actions:
            pixels, _, _, info = env.step(ACTION_INDEX[action])
            unlocked.update(name for name, count in info["achievements"].items() if count > 0)
    last = _last_frame(episode.id)
    if last.step != env.step_count:
        raise PlayError(
            f"the game could not be rebuilt: its turns reach step {env.step_count}, "
            f"its last frame is step {last.step}"
        )
    sha256 = hashlib.sha256(encode_png(pixels).png).hexdigest()
    if sha256 != last.sha256:
        raise PlayError(
            f"the game could not be rebuilt: the replayed frame at step {last.step} has "
            f"sha256 {sha256}, the stored frame {last.sha256}"
        )
    return PlaySnapshot(env=env, frame_id=last.id, frame_step=last.step, unlocked=unlocked)


def _snapshot_load(episode: Episode, turns: int) -> PlaySnapshot:
    snapshot = cache.get(_snapshot_key(episode.id, turns))
    if isinstance(snapshot, PlaySnapshot):
        return snapshot
    return play_rebuild(episode=episode)


def _snapshot_save(episode_id: int, turns: int, snapshot: PlaySnapshot) -> None:
    cache.set(_snapshot_key(episode_id, turns), snapshot, SNAPSHOT_SECONDS)
    # The snapshot before this one can never be used again.
    cache.delete(_snapshot_key(episode_id, turns - 1))


def _frame_store(*, episode: Episode, env: StudioEnv, pixels) -> Frame:
    encoded = encode_png(pixels)
    sha256, name = FrameStore().put(encoded.png)
    return Frame.objects.create(
        episode=episode,
        step=env.step_count,
        sha256=sha256,
        image=name,
        width=encoded.width,
        height=encoded.height,
        state=env.state(),
    )


def _turns_recorded(episode_id: int) -> int:
    """Turns are numbered 0, 1, ...: the last index plus one. One index entry read, where
    COUNT(*) would visit every turn of a long game."""
    last = (
        Turn.objects.filter(episode_id=episode_id)
        .order_by("-index")
        .values_list("index", flat=True)
        .first()
    )
    return 0 if last is None else last + 1


def _last_frame(episode_id: int) -> Frame:
    return Frame.objects.filter(episode_id=episode_id).order_by("-step").first()


def _finish(episode: Episode) -> None:
    totals = EpisodeTotals(
        steps=episode.steps,
        total_reward=episode.total_reward,
        achievements=dict(episode.achievements),
    )
    services.episode_finish(episode=episode, claim_token=episode.claim_token, totals=totals)
