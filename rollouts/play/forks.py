"""Forks: a new episode that replays another's executed actions up to turn K, then plays on.

The replay is checked frame by frame against the original's sha256 (rollouts.recording.recorder):
a fork of an episode whose game cannot be reproduced fails with that error. A fork played by
a model or a baseline is an ordinary batch of one episode, run by a worker (or inline); a
fork played by a person has its prefix recorded here, then waits for its player.
"""

from __future__ import annotations

import dataclasses

from django.db import transaction

from rollouts.models import Episode, RolloutBatch
from rollouts.play.services import play_claim
from rollouts.recording import services
from rollouts.recording.fork_replay import ForkError, fork_prefix
from rollouts.recording.recorder import (
    EpisodeRecorder,
    ForkDiverged,
    ForkPrefix,
)
from rollouts.rollout_settings import HUMAN_POLICY, RolloutSettings, SettingsError


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


def _record_prefix_for_player(*, episode: Episode, prefix: ForkPrefix) -> None:
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
