"""A run's page shows the concurrency it asked for and the one the workers gave it, measured
from when each episode (or chunk of questions) started and ended."""

from __future__ import annotations

import html
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from probes import runs
from probes.services import probe_set_create
from rollouts.models import Episode
from rollouts.recording import services
from rollouts.review.turn_selection import TurnSelection
from rollouts.rollout_settings import RolloutSettings
from rollouts.tests.helpers import record_batch

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def _spans(rows, spans: list[tuple[int, int]]) -> None:
    """Date the rows, in order, as worked on from second a to second b after T0."""
    for row, (a, b) in zip(rows, spans, strict=True):
        type(row).objects.filter(pk=row.pk).update(
            started_at=T0 + timedelta(seconds=a), finished_at=T0 + timedelta(seconds=b)
        )


@pytest.mark.django_db
def test_the_batch_page_shows_the_episodes_played_at_once(editor_client, chat_endpoint):
    batch = services.batch_create(
        settings=RolloutSettings(
            policy="openai",
            model="m",
            endpoint=chat_endpoint.name,
            base_url=chat_endpoint.base_url,
            seeds=(0, 1, 2, 3),
            steps=2,
            concurrency=16,
        ),
        enqueue=False,
    )
    # Two at a time, as a worker of two processes plays them: 0-10 and 0-10, then 10-20 and
    # 10-20 (an end and a start at the same instant are one handed on, not two at once).
    _spans(Episode.objects.filter(batch=batch).order_by("seed"), [(0, 10), (0, 10), (10, 20),
                                                                   (10, 20)])  # fmt: skip
    page = html.unescape(
        editor_client.get(reverse("rollouts:batch_detail", args=[batch.id])).content.decode()
    )
    assert "16 requested; at most 2 episodes played at once" in page


@pytest.mark.django_db
def test_the_probe_run_page_shows_the_questions_in_flight_at_once(editor_client, chat_endpoint):
    frames = record_batch(seeds=(0,), steps=20, name="frames")
    probe_set = probe_set_create(filters=TurnSelection(batches=(frames.id,)), seed=1)
    run = runs.probe_run_create(
        probe_set=probe_set, endpoint_name=chat_endpoint.name, model="m", concurrency=4,
        enqueue=False,
    )  # fmt: skip
    chunks = list(run.chunks.order_by("index")[:4])  # the others not started yet
    # 0-10, 0-10, 5-15, 10-20: three at once from 5 to 10 s, then two.
    _spans(chunks, [(0, 10), (0, 10), (5, 15), (10, 20)])
    page = html.unescape(
        editor_client.get(reverse("probes:run_detail", args=[run.id])).content.decode()
    )
    assert "4 requested" in page
    assert "at most 3 questions in flight at once" in page
