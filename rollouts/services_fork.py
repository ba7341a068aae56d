"""Forks: a new episode that replays another's executed actions up to turn K, then plays on.

The replay is checked frame by frame against the original's sha256 (rollouts.recorder):
a fork of an episode whose game cannot be reproduced fails with that error. A fork played by
a model or a baseline is an ordinary batch of one episode, run by a worker (or inline); a
fork played by a person has its prefix recorded here, then waits for its player.
"""

from __future__ import annotations

import dataclasses

from django.db import transaction

from rollouts import services
from rollouts.models import Episode, Frame, RolloutBatch, Turn, TurnRelabel
from rollouts.recorder import FORK_COPIED_FIELDS, EpisodeRecorder, ForkDiverged, ForkPrefix
from rollouts.rollout_settings import HUMAN_POLICY, RolloutSettings, SettingsError


class ForkError(ValueError):
    """The fork cannot be made or failed its replay; the message says why, in one line."""


def fork_settings(
    *, source: Episode, settings: RolloutSettings, steps: int | None
) -> RolloutSettings:
    """The fork's batch options: the policy's options as given, the original's world and size."""
    batch = source.batch
    return dataclasses.replace(
        settings,
        seeds=(int(source.seed),),
        image_size=batch.image_size,
        steps=steps if steps is not None else batch.step_limit,
    )


def fork_prefix(*, source: Episode, turn: int, with_correction: bool) -> ForkPrefix:
    """What the fork replays; raises ForkError when the turn cannot be forked from."""
    count = Turn.objects.filter(episode_id=source.id).count()
    if not 0 <= turn < count:
        raise ForkError(
            f"turn: episode {source.id} has turns 0 to {count - 1}; there is no turn {turn}"
            if count
            else f"turn: episode {source.id} has no turns to fork from"
        )
    fork_step = Frame.objects.filter(turns__episode_id=source.id, turns__index=turn).values_list(
        "step", flat=True
    )[0]
    correction = None
    if with_correction:
        relabel = TurnRelabel.objects.filter(turn__episode_id=source.id, turn__index=turn).first()
        if relabel is None:
            raise ForkError(f"turn {turn} of episode {source.id} has no correction to fork with")
        correction = tuple(relabel.actions)
    turns = list(
        Turn.objects.filter(episode_id=source.id, index__lt=turn)
        .order_by("index")
        .values("actions", *FORK_COPIED_FIELDS)
    )
    frames = dict(
        Frame.objects.filter(episode_id=source.id, step__lte=fork_step).values_list(
            "step", "sha256"
        )
    )
    return ForkPrefix(
        source_episode_id=source.id,
        turns=turns,
        frame_sha256=frames,
        fork_step=fork_step,
        correction=correction,
    )


def episode_fork(
    *,
    source: Episode,
    turn: int,
    settings: RolloutSettings,
    with_correction: bool = False,
    created_by=None,
    enqueue: bool = True,
) -> Episode:
    """Create the fork (and for a person's fork, record its prefix).

    Raises ForkError when the fork cannot be made; a fork whose replay diverges is made and
    fails (status `failed`, the sha256 error on the episode).
    """
    prefix = fork_prefix(source=source, turn=turn, with_correction=with_correction)
    needed = prefix.fork_step + (len(prefix.correction) if prefix.correction else 0)
    if settings.steps <= needed:
        raise ForkError(
            f"steps: the fork starts at step {needed}; its step limit ({settings.steps}) "
            "must be higher"
        )
    if settings.seeds != (int(source.seed),) or settings.image_size != source.batch.image_size:
        raise SettingsError("a fork plays the original's seed at the original's image size")
    human = settings.policy == HUMAN_POLICY
    name = settings.name or f"Fork of episode {source.id} at turn {turn}"
    with transaction.atomic():
        batch = services.batch_create(
            settings=dataclasses.replace(settings, name=name),
            created_by=created_by,
            enqueue=False,
        )
        episode = batch.episodes.get()
        episode.forked_from = source
        episode.forked_at_turn = turn
        episode.fork_prefix_turns = turn + (1 if prefix.correction else 0)
        episode.fork_with_correction = prefix.correction is not None
        episode.save(
            update_fields=[
                "forked_from",
                "forked_at_turn",
                "fork_prefix_turns",
                "fork_with_correction",
            ]
        )
        if enqueue and not human:
            transaction.on_commit(lambda: services.batch_enqueue(batch=batch))
    if human:
        _record_prefix_for_player(episode=episode, prefix=prefix)
    return episode


def fork_prefix_of(*, episode: Episode) -> ForkPrefix | None:
    """The prefix a fork episode replays (None for an episode that is not a fork)."""
    if episode.forked_at_turn is None:
        return None
    if episode.forked_from_id is None:
        raise ForkError("the episode this fork replays has been deleted")
    source = Episode.objects.get(id=episode.forked_from_id)
    return fork_prefix(
        source=source, turn=episode.forked_at_turn, with_correction=episode.fork_with_correction
    )


def _record_prefix_for_player(*, episode: Episode, prefix: ForkPrefix) -> None:
    from rollouts.services_play import play_claim

    play_claim(episode=episode)
    batch = RolloutBatch.objects.get(id=episode.batch_id)
    recorder = EpisodeRecorder(
        episode=episode,
        settings=services.batch_settings(batch),
        policy=None,  # type: ignore[arg-type]  # the prefix asks no policy
        claim_token=episode.claim_token,
        prefix=prefix,
        prefix_only=True,
    )
    try:
        totals = recorder.play()
    except ForkDiverged as exc:
        # The fork stays, failed, with the reason: the caller shows it.
        services.episode_fail(
            episode=episode, claim_token=episode.claim_token, error=str(exc), totals=recorder.totals
        )
        episode.refresh_from_db()
        return
    Episode.objects.filter(id=episode.id).update(
        steps=totals.steps,
        total_reward=totals.total_reward,
        achievements=totals.achievements,
        achievement_count=len(totals.achievements),
    )
    episode.refresh_from_db()
