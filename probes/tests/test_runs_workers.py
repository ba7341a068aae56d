"""Probe runs on real Celery workers: chunks as tasks, the endpoint's limit across runs, and
a worker killed mid-run whose chunk is taken over without asking an answered question again."""

from __future__ import annotations

import json
import os
import time

import pytest
from django.core.management import call_command

from probes import runs
from probes.jobs import PROBE_CHUNK
from probes.models import ProbeAnswer, ProbeRun, ProbeRunChunk
from probes.services import probe_set_create
from rollouts.policies.rate_limit import limiter_for
from rollouts.review.turn_selection import TurnSelection
from rollouts.tests import openai_server as replies
from rollouts.tests.helpers import record_batch
from studio.testing import (
    JOB_ENDS,
    backdate,
    celery_worker_running,
    subprocess_env,
    wait_for_row,
    wait_until,
)

pytestmark = pytest.mark.django_db(transaction=True)

KEY_VARIABLE = "STUDIO_TEST_CHAT_KEY"  # conftest's chat_endpoint fixture


@pytest.fixture
def probe_set(transactional_db):
    batch = record_batch(seeds=(6,), steps=8)
    return probe_set_create(
        filters=TurnSelection(batches=(batch.id,)), kinds=["night", "asleep", "vital"], seed=2
    )


def test_it_asks_each_chunk_on_a_worker_and_keeps_the_endpoint_limit_across_runs(
    probe_set, chat_server, chat_endpoint, celery_worker, capsys
):
    chat_server.delay = 0.05
    chat_server.default = replies.text("A")
    total = probe_set.questions.count()
    # Two runs at once on the same endpoint, each allowed 2 requests in flight: 4 chunks on
    # 4 worker threads, and never more than 2 requests at the server.
    first, second = (
        runs.probe_run_create(
            probe_set=probe_set,
            endpoint_name=chat_endpoint.name,
            model="vlm-test",
            observation=observation,
            concurrency=2,
        )
        for observation in ("image", "none")
    )
    for run in (first, second):
        assert run.chunks.count() == 2
        wait_for_row(run, statuses=JOB_ENDS, timeout=120)
        assert run.status == "done", run.error
        assert run.answered == total and run.model_calls == total
    assert ProbeAnswer.objects.count() == 2 * total
    assert len(chat_server.requests) == 2 * total
    assert chat_server.max_in_flight == 2
    assert not ProbeRunChunk.objects.exclude(status="done").exists()

    # The command's --wait follows a run on the worker and prints its summary.
    call_command(
        "probe_run",
        str(probe_set.id),
        "--endpoint",
        chat_endpoint.name,
        "--model",
        "vlm-test",
        "--observation",
        "text",
        "--wait",
    )
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["observation"] == "text" and summary["status"] == "done"
    assert summary["answered"] == total and summary["errors"] == 0


def test_a_run_whose_worker_is_killed_resumes_without_asking_again(
    probe_set, chat_server, chat_endpoint, settings
):
    chat_server.delay = 0.1
    chat_server.default = replies.text("B")
    total = probe_set.questions.count()
    assert total >= 30
    env = subprocess_env(
        CELERY_BROKER_URL=os.environ["CELERY_BROKER_URL"],
        STUDIO_MEDIA_ROOT=str(settings.MEDIA_ROOT),
        **{KEY_VARIABLE: os.environ[KEY_VARIABLE]},
    )
    with celery_worker_running(process=True, env=env) as worker:
        # One chunk (concurrency 1), asked by the worker process, question after question.
        run = runs.probe_run_create(
            probe_set=probe_set, endpoint_name=chat_endpoint.name, model="vlm-test", concurrency=1
        )
        chunk = run.chunks.get()
        wait_until(
            lambda: ProbeAnswer.objects.filter(run=run).count() >= 8,
            timeout=120,
            what="8 answers from the first worker",
        )
        worker.kill_all()
    time.sleep(0.3)  # a request the worker sent as it died has reached the server
    answered_before = ProbeAnswer.objects.filter(run=run).count()
    asked_before = len(chat_server.requests)
    assert 8 <= answered_before < total
    assert asked_before - answered_before <= 1  # at most the call in flight at the kill
    chunk.refresh_from_db()
    assert chunk.status == "running"

    # The chunk's claim goes stale (no worker renews it); the periodic requeue sends it again
    # and a new worker takes it over.
    backdate(chunk, field="heartbeat_at", seconds=settings.STUDIO_PROBE_CHUNK_STALE_SECONDS + 1)
    # So does the endpoint slot the dead worker held (its lease outlives any request: 90 s).
    limiter = limiter_for(
        base_url=chat_server.url, concurrency=1, requests_per_minute=0, lease_seconds=90
    )
    assert limiter.in_flight() <= 1
    limiter.client.delete(limiter.slots_key)
    with celery_worker_running():
        assert PROBE_CHUNK.requeue() == [chunk.id]
        wait_for_row(run, statuses=JOB_ENDS, timeout=120)
    assert run.status == "done", run.error
    assert run.answered == total == ProbeAnswer.objects.filter(run=run).count()
    # Only the questions without an answer were asked again.
    assert len(chat_server.requests) - asked_before == total - answered_before
    # Every request counted, the one the killed worker had in flight too.
    assert ProbeRun.objects.get(id=run.id).model_calls == len(chat_server.requests)


def test_a_canceled_run_stops_asking_and_resumes_what_is_left(
    probe_set, chat_server, chat_endpoint, celery_worker, capsys
):
    chat_server.delay = 0.2
    chat_server.default = replies.text("A")
    total = probe_set.questions.count()
    run = runs.probe_run_create(
        probe_set=probe_set, endpoint_name=chat_endpoint.name, model="vlm-test", concurrency=2
    )
    wait_until(lambda: run.answers.count() >= 4, timeout=60, what="4 answers")
    call_command("probe_run", "--cancel", str(run.id))
    sent_at_cancel = len(chat_server.requests)
    answered_at_cancel = run.answers.count()
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["status"] == "canceled" and summary["run_id"] == run.id
    time.sleep(2.5)  # time for a dozen more calls, were any still made
    # At most the call each of its two chunks had started: neither is stored.
    assert len(chat_server.requests) - sent_at_cancel <= 2
    assert run.answers.count() == answered_at_cancel < total
    run.refresh_from_db()
    assert run.status == "canceled" and run.error == "canceled"
    assert not run.chunks.filter(status__in=["pending", "running"]).exists()

    assert runs.probe_run_resume(run=run) == 2
    wait_for_row(run, statuses=JOB_ENDS, timeout=120)
    assert run.status == "done" and run.answered == total == run.answers.count()
    # Every request counted, the ones whose answers the cancel threw away included.
    assert run.model_calls == len(chat_server.requests)
