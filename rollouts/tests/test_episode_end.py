"""Ending episodes: the batch's counters and its close, when many episodes end at once."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from rollouts.models import Episode, RolloutBatch
from rollouts.recording import services
from rollouts.recording.recorder import EpisodeTotals
from rollouts.rollout_settings import RolloutSettings
from studio.testing import wait_until


def _running_batch(episodes: int) -> tuple[RolloutBatch, list[tuple[Episode, str]]]:
    batch = services.batch_create(
        settings=RolloutSettings(policy="scripted", seeds=tuple(range(episodes)), steps=3),
        enqueue=False,
    )
    claimed = []
    for episode in batch.episodes.order_by("seed"):
        token = services.episode_claim(episode_id=episode.id)
        assert token is not None
        claimed.append((episode, token))
    return batch, claimed


def _totals(seed: int) -> EpisodeTotals:
    return EpisodeTotals(
        steps=3,
        model_calls=seed + 1,
        model_errors=seed % 2,
        bad_outputs=1,
        model_retries=seed,
        prompt_tokens=100 * seed,
        completion_tokens=10 * seed,
    )


def _end_together(claimed, *, fail_seeds=()) -> None:
    """Each episode ended by a thread of its own (its own connection), all let go at once."""
    start = threading.Barrier(len(claimed))
    errors: list[BaseException] = []

    def end(episode: Episode, token: str) -> None:
        try:
            start.wait()
            if episode.seed in fail_seeds:
                services.episode_fail(
                    episode=episode, claim_token=token, error="boom", totals=_totals(episode.seed)
                )
            else:
                services.episode_finish(
                    episode=episode, claim_token=token, totals=_totals(episode.seed)
                )
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=end, args=pair) for pair in claimed]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors


@pytest.mark.django_db(transaction=True)
def test_episodes_ending_together_count_once_each_and_close_the_batch_once():
    batch, claimed = _running_batch(16)
    _end_together(claimed, fail_seeds={3, 8})
    batch.refresh_from_db()
    seeds = range(16)
    assert batch.status == RolloutBatch.Status.FINISHED
    assert batch.finished_at is not None
    assert (batch.episodes_finished, batch.episodes_failed) == (14, 2)
    assert batch.model_calls == sum(s + 1 for s in seeds)
    assert batch.model_errors == sum(s % 2 + 1 for s in seeds)
    assert batch.model_retries == sum(seeds)
    assert batch.prompt_tokens == 100 * sum(seeds)
    assert batch.completion_tokens == 10 * sum(seeds)
    # Ending again (a message delivered twice) counts nothing more.
    episode, token = claimed[0]
    services.episode_finish(episode=episode, claim_token=token, totals=_totals(0))
    batch.refresh_from_db()
    assert (batch.episodes_finished, batch.episodes_failed) == (14, 2)


@pytest.mark.django_db(transaction=True)
def test_the_batch_stays_open_until_its_last_episode_ends():
    batch, claimed = _running_batch(3)
    for episode, token in claimed[:2]:
        services.episode_finish(episode=episode, claim_token=token, totals=_totals(0))
        batch.refresh_from_db()
        assert batch.status == RolloutBatch.Status.RUNNING
        assert batch.finished_at is None
    episode, token = claimed[2]
    services.episode_fail(episode=episode, claim_token=token, error="boom", totals=_totals(0))
    batch.refresh_from_db()
    assert batch.status == RolloutBatch.Status.FINISHED
    assert batch.finished_at is not None
    assert (batch.episodes_finished, batch.episodes_failed) == (2, 1)


@pytest.mark.django_db(transaction=True)
def test_a_failed_batch_keeps_its_status_and_its_last_episode_dates_its_end():
    batch, claimed = _running_batch(4)
    services.batch_fail(batch=batch, error="endpoint down")  # all 4 are running: none skipped
    batch.refresh_from_db()
    assert (batch.status, batch.finished_at) == (RolloutBatch.Status.FAILED, None)
    _end_together(claimed[:3])
    batch.refresh_from_db()
    assert (batch.status, batch.finished_at) == (RolloutBatch.Status.FAILED, None)
    episode, token = claimed[3]
    services.episode_finish(episode=episode, claim_token=token, totals=_totals(3))
    batch.refresh_from_db()
    assert batch.status == RolloutBatch.Status.FAILED
    assert batch.finished_at is not None
    assert batch.episodes_finished == 4


@pytest.mark.django_db(transaction=True)
def test_a_claim_that_waited_behind_the_batch_ending_leaves_it_finished():
    """A claim that started while the batch was pending, and waited for its row while the
    last episode ended it, must not set it back to running."""

    import psycopg

    batch, _ = _running_batch(1)
    RolloutBatch.objects.filter(id=batch.id).update(status=RolloutBatch.Status.PENDING)
    late = Episode.objects.create(batch=batch, seed=99, sample=0)
    db = connections["default"].settings_dict
    url = f"postgresql://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    with psycopg.connect(url) as ending:
        # The batch's end, not yet committed: it holds the row's lock.
        ending.execute(
            "UPDATE rollouts_rolloutbatch SET status = 'finished', finished_at = now() "
            "WHERE id = %s",
            [batch.id],
        )
        claim = threading.Thread(
            target=lambda: (services.episode_claim(episode_id=late.id), connections.close_all())
        )
        claim.start()
        with psycopg.connect(url, autocommit=True) as watcher:
            wait_until(
                lambda: watcher.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' "
                    "AND query LIKE 'UPDATE \"rollouts_rolloutbatch\"%%'"
                ).fetchone(),
                timeout=60,
                what="the claim to wait for the row",
            )
        ending.commit()
        claim.join()
    batch.refresh_from_db()
    assert batch.status == RolloutBatch.Status.FINISHED
    assert batch.finished_at is not None
