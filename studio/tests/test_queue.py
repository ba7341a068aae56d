"""Sending a run of jobs to the broker: every message once, in order, in bulk."""

from __future__ import annotations

import base64
import json

import pytest

from rollouts.tests.helpers import REDIS_URL, needs_redis
from studio.queue import STAMP_EVERY, resend


@needs_redis
@pytest.mark.django_db
def test_every_message_of_a_long_run_reaches_the_broker_once_in_order():
    import redis
    from celery import Celery

    from rollouts.models import Episode

    # An app of its own, sending to a queue no worker reads.
    name = "studio-test-send-runs"
    app = Celery("send-runs-test", broker=REDIS_URL)
    app.conf.task_default_queue = name

    @app.task(name="studio.tests.send_runs_probe")
    def probe(episode_id: int) -> None:
        pass

    client = redis.Redis.from_url(REDIS_URL)
    client.delete(name)
    ids = list(range(10**12, 10**12 + STAMP_EVERY + 100))  # two round trips
    try:
        assert resend(Episode, probe, ids) == len(ids)
        # Pushed on the left, taken from the right: the oldest message is the last.
        messages = [json.loads(raw) for raw in reversed(client.lrange(name, 0, -1))]
    finally:
        client.delete(name)
        app.close()
    assert [json.loads(base64.b64decode(m["body"]))[0][0] for m in messages] == ids
