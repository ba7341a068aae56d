"""The job page stays small and quick with a million loss points: the chart is drawn from a
series downsampled in the database (each step range's min and max, so a spike survives) and
the timeline shows the newest events only."""

from __future__ import annotations

import re
import statistics
import time
import uuid

import pytest
from django.db import connection

from curation.models import Dataset, DatasetVersion
from training.models import TrainingEvent, TrainingJob
from training.selectors import CHART_BUCKETS, EVENTS_COUNTED, EVENTS_SHOWN

POINTS = 1_000_000
STEPS = POINTS // 2  # a train and a validation point per step
SPIKE_STEP = 123_457
SPIKE = 97.5
MAX_BYTES = 200 * 1024


@pytest.fixture
def job_with_a_million_points(db, submitter) -> TrainingJob:
    dataset = Dataset.objects.create(name="big run")
    version = DatasetVersion.objects.create(dataset=dataset, number=1)
    job = TrainingJob.objects.create(
        dataset_version=version,
        base_url="http://127.0.0.1:9/api",
        model="openai/gpt-4o-mini-2024-07-18",
        config_toml="",
        idempotency_key=uuid.uuid4().hex,
        status=TrainingJob.Status.RUNNING,
        remote_job_id="sft-1",
        created_by=submitter,
    )
    # Rows as synth's metrics are stored: one per (series, step), odd i train, even i val,
    # the loss falling with a little noise, and one spike on the train curve.
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {TrainingEvent._meta.db_table}
                (job_id, remote_id, time, level, type, message, step, train_loss,
                 validation_loss, data)
            SELECT %(job)s, 'm' || i, now() - interval '30 days' + i * interval '1 second',
                'info', 'metric', '', (i + 1) / 2,
                CASE WHEN i %% 2 = 1 THEN
                    CASE WHEN (i + 1) / 2 = %(spike_step)s THEN %(spike)s
                    ELSE 2.0 * exp(-i / 400000.0) + 0.05 * sin(i) END
                END,
                CASE WHEN i %% 2 = 0 THEN 2.1 * exp(-i / 400000.0) END,
                '{{}}'::jsonb
            FROM generate_series(1, %(points)s) AS i
            """,
            {"job": job.id, "points": POINTS, "spike_step": SPIKE_STEP, "spike": SPIKE},
        )
        cursor.execute(f"ANALYZE {TrainingEvent._meta.db_table}")
    return job


def _points(html: str, series: str) -> list[tuple[float, float]]:
    found = re.search(rf'<polyline class="{series}"[^>]* points="([^"]*)"', html)
    assert found, f"no {series} polyline"
    return [tuple(map(float, pair.split(","))) for pair in found.group(1).split()]


def test_it_serves_the_job_page_of_a_million_points_bounded(
    client, submitter, job_with_a_million_points, django_assert_max_num_queries
):
    job = job_with_a_million_points
    client.force_login(submitter)
    client.get(f"/training/{job.id}/")  # templates compiled, session loaded: not timed
    for name, headers in (("page", {}), ("refresh partial", {"HX-Request": "true"})):
        timings = []
        for _ in range(5):
            with django_assert_max_num_queries(12):
                started = time.perf_counter()
                response = client.get(f"/training/{job.id}/", headers=headers)
                timings.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200
        body = response.content
        html = body.decode()
        print(
            f"\n{name} at {POINTS:,} points: {len(body):,} bytes, "
            f"p50 {statistics.median(timings):.0f} ms ({', '.join(f'{t:.0f}' for t in timings)})"
        )
        assert len(body) < MAX_BYTES
        assert ('<div id="job-body"' in html) and (("<html" in html) == (name == "page"))

        train, validation = _points(html, "train"), _points(html, "val")
        assert 0 < len(train) <= 2 * CHART_BUCKETS and 0 < len(validation) <= 2 * CHART_BUCKETS
        # The spike is the chart's highest loss: the axis says its value and the train line
        # reaches the top (y = 24) where its step is.
        axis = re.search(r'data-losses="([^ ]+) ([^"]+)"', html)
        assert axis and float(axis.group(2)) == SPIKE
        assert f">{SPIKE:.4f}</text>" in html
        top = [x for x, y in train if y == 24.0]
        assert len(top) == 1
        spike_x = 24 + (640 - 48) * (SPIKE_STEP - 1) / (STEPS - 1)
        assert abs(top[0] - spike_x) < 1  # within its sub-pixel step range
        # Both curves, with every point counted in the legend.
        assert "train loss (500,000)" in html and "validation loss (500,000)" in html

        # The newest events only, dated, and the rest counted (to a bound).
        timeline = html[html.index('id="timeline"') :]
        assert timeline.count("<li ") == EVENTS_SHOWN
        assert f"more than {EVENTS_COUNTED:,} earlier events not shown" in html
        newest = TrainingEvent.objects.filter(job=job).latest("time", "id")
        assert newest.time.strftime("%Y-%m-%d") in timeline
        assert f"step {newest.step}" in timeline
