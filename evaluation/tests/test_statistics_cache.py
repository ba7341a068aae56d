"""The statistics cache is shared by processes (Redis) and warmed when a batch finishes."""

from __future__ import annotations

import os
import subprocess
import sys
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.db import connection

from evaluation import selectors
from rollouts.models import Episode, RolloutBatch
from rollouts.tests.helpers import record_batch
from studio.testing import queue_drained


def _studio_rows():
    return [row for row in selectors.leaderboard_rows() if not row.is_reference]


def test_a_leaderboard_another_process_computed_is_read_from_the_cache(
    transactional_db, cache_of_its_own, django_assert_num_queries
):
    batch = RolloutBatch.objects.create(
        policy="random", seeds=[0, 1, 2], status="finished", settings={}
    )
    Episode.objects.bulk_create(
        Episode(batch=batch, seed=s, status="finished" if s else "failed", achievements={})
        for s in range(3)
    )
    url = urlsplit(os.environ["DATABASE_URL"])
    test_database = urlunsplit(url._replace(path="/" + connection.settings_dict["NAME"]))
    env = {
        **os.environ,
        "DATABASE_URL": test_database,
        "STUDIO_CACHE_PREFIX": cache_of_its_own,
        "STUDIO_STATISTICS_CACHE_SECONDS": "600",
    }
    warm = "import django; django.setup(); from evaluation import tasks; "
    warm += "print(tasks.statistics_warm())"
    done = subprocess.run(
        [sys.executable, "-c", warm], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["6"]  # one configuration and the paper's five agents
    # Finished batches and their episodes' signature: the episodes are not read here.
    with django_assert_num_queries(2):
        (row,) = _studio_rows()
    assert (row.summary.episodes, row.summary.failed) == (3, 1)


def test_a_batch_whose_last_episode_ends_has_a_worker_warm_the_leaderboard(
    celery_worker, django_assert_num_queries
):
    batch = record_batch(policy="random", seeds=(0, 1), steps=5)
    assert batch.status == "finished"
    queue_drained()
    with django_assert_num_queries(2):
        (row,) = _studio_rows()
    assert row.batch_ids == [batch.id] and row.summary.episodes == 2


@pytest.mark.django_db
def test_an_unreachable_cache_costs_a_miss_not_the_page(settings, viewer_client):
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
        }
    }
    assert viewer_client.get("/leaderboard/").status_code == 200
