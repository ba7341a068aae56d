"""Cancel stops model work within one call: from the batch page's service
and from `rollout --cancel`, a running model episode makes no request after it."""

from __future__ import annotations

import io
import json
import time

import pytest
from django.core.management import call_command

from rollouts.models import Episode, RolloutBatch
from rollouts.recording import services
from rollouts.recording.recorder import CLAIM_CHECK_SECONDS
from rollouts.rollout_settings import RolloutSettings
from studio.testing import manage, subprocess_env, wait_until

CALL_SECONDS = 0.3


def test_a_canceled_model_batch_makes_no_request_later_than_one_call_after(
    celery_worker, chat_server, chat_endpoint
):
    chat_server.delay = CALL_SECONDS  # every answer takes this long
    batch = services.batch_create(
        settings=RolloutSettings(
            policy="openai",
            model="test-vlm",
            endpoint=chat_endpoint.name,
            base_url=chat_endpoint.base_url,
            seeds=tuple(range(8)),
            steps=200,
            concurrency=4,
        )
    )
    wait_until(
        lambda: len(chat_server.requests) >= 12,
        timeout=60,
        what=lambda: f"12 model calls; the batch: {RolloutBatch.objects.get(id=batch.id).error}",
    )
    canceled_at = time.monotonic()
    assert services.batch_cancel(batch=RolloutBatch.objects.get(id=batch.id)) == 8
    # Long enough for a worker that never noticed to make several more calls.
    time.sleep(CLAIM_CHECK_SECONDS + 6 * CALL_SECONDS)
    after = [r.at - canceled_at for r in chat_server.requests if r.at > canceled_at]
    # A call in flight at the cancel ends; an episode between calls sees the cancel at its
    # next claim check (at most a second old): no request later than that.
    assert all(delay <= CLAIM_CHECK_SECONDS + CALL_SECONDS + 0.5 for delay in after), after
    assert len(after) <= 2 * 4  # at most a call or two for each episode that was playing
    ended = Episode.objects.filter(batch_id=batch.id).values_list("status", "error")
    assert set(ended) == {(Episode.Status.CANCELED, "canceled")}
    # Every request the server received is counted, on the batch and on its episodes, and
    # what the canceled episodes played is kept: one turn for each answered call.
    wait_until(
        lambda: not services.batch_episodes_still_playing(batch=batch), timeout=10, what="let go"
    )
    received = len(chat_server.requests)
    batch.refresh_from_db()
    assert batch.model_calls == received
    episodes = Episode.objects.filter(batch_id=batch.id)
    assert sum(e.model_calls for e in episodes) == received
    assert sum(e.turns.count() for e in episodes) == received
    assert batch.prompt_tokens == 120 * received  # the server's usage: 120 prompt tokens a call


@pytest.mark.django_db
def test_rollout_cancel_stops_a_batch_and_prints_its_summary():
    batch = services.batch_create(
        settings=RolloutSettings(policy="scripted", seeds=(0, 1), steps=5), enqueue=False
    )
    out, err = io.StringIO(), io.StringIO()
    call_command("rollout", "--cancel", str(batch.id), stdout=out, stderr=err)
    summary = json.loads(out.getvalue().splitlines()[-1])
    assert (summary["batch_id"], summary["episodes"]) == (batch.id, 2)
    assert summary["status"] == "canceled"
    assert err.getvalue().strip() == f"Batch {batch.id} canceled: 2 episode(s) stopped."
    # Again: nothing left to stop, said so, same summary.
    out, err = io.StringIO(), io.StringIO()
    call_command("rollout", "--cancel", str(batch.id), stdout=out, stderr=err)
    assert json.loads(out.getvalue().splitlines()[-1])["status"] == "canceled"


def test_rollout_cancel_of_no_batch_is_one_line_and_exit_2(transactional_db):
    done = manage("rollout", "--cancel", "987654", env=subprocess_env())
    assert done.returncode == 2
    # One line, as every command's usage errors (`--resume` of no batch says the same).
    assert done.stderr.strip().splitlines() == ["rollout: error: cancel: there is no batch 987654"]
    assert done.stdout == ""


def test_a_cancel_stops_the_retries_of_a_call_and_counts_them(
    celery_worker, chat_server, chat_endpoint
):
    from rollouts.tests.openai_server import status

    # Every answer is a 429 asking for 0.2 s: one call, retried for as long as it is let.
    chat_server.default = status(429, retry_after="0.2")
    batch = services.batch_create(
        settings=RolloutSettings(
            policy="openai",
            model="test-vlm",
            endpoint=chat_endpoint.name,
            base_url=chat_endpoint.base_url,
            seeds=(0,),
            steps=10,
            max_retries=20,
        )
    )
    wait_until(lambda: len(chat_server.requests) >= 5, timeout=60, what="5 tries of the call")
    canceled_at = time.monotonic()
    services.batch_cancel(batch=RolloutBatch.objects.get(id=batch.id))
    wait_until(
        lambda: not services.batch_episodes_still_playing(batch=batch), timeout=10, what="let go"
    )
    time.sleep(1.0)
    after = [r.at - canceled_at for r in chat_server.requests if r.at > canceled_at]
    # The retries stop at the next try once the claim check sees the cancel (at most a
    # second old), instead of going on for all 20 tries.
    assert all(delay <= CLAIM_CHECK_SECONDS + 0.5 for delay in after), after
    batch.refresh_from_db()
    # Each request is a call or a retry, all counted though the turn was never played.
    assert batch.model_calls + batch.model_retries == len(chat_server.requests)
    assert Episode.objects.get(batch_id=batch.id).turns.count() == 0
