"""A job's loss series cut into step ranges, on whichever database the studio runs on (this
module also runs on the demo's SQLite: `tests/test_every_page.py`)."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from django.utils import timezone

from curation.models import Dataset, DatasetVersion
from training.models import TrainingEvent, TrainingJob
from training.selectors import LossBucket, job_loss_series

pytestmark = pytest.mark.django_db


@pytest.fixture
def job() -> TrainingJob:
    version = DatasetVersion.objects.create(dataset=Dataset.objects.create(name="d"), number=1)
    return TrainingJob.objects.create(
        dataset_version=version,
        base_url="http://127.0.0.1:9/api",
        model="m",
        config_toml="",
        idempotency_key=uuid.uuid4().hex,
    )


def _event(job: TrainingJob, n: int, **fields) -> TrainingEvent:
    at = timezone.now() - dt.timedelta(hours=1) + dt.timedelta(seconds=n)
    return TrainingEvent(job=job, remote_id=f"e{n}", time=at, **fields)


def test_it_cuts_the_steps_into_ranges_keeping_each_ones_extremes(job):
    # Train loss at steps 1-10 (the loss is the step's number), validation at 2, 3 and 9; an
    # event without a loss and a loss without a step are not points.
    TrainingEvent.objects.bulk_create(
        [
            *(_event(job, step, step=step, train_loss=float(step)) for step in range(1, 11)),
            _event(job, 20, step=2, validation_loss=0.5),
            _event(job, 21, step=3, validation_loss=0.25),
            _event(job, 22, step=9, validation_loss=0.75),
            _event(job, 23, step=5, message="checkpoint saved"),
            _event(job, 24, train_loss=99.0),
        ]
    )
    series = job_loss_series(job=job, buckets=4)
    # Steps 1-10 (10 of them) in 4 ranges starting at 1 + ceil(k * 10 / 4): 1, 4, 6, 9.
    assert series.train == [
        LossBucket(1, 4, 1.0, 3.0, 3),
        LossBucket(4, 6, 4.0, 5.0, 2),
        LossBucket(6, 9, 6.0, 8.0, 3),
        LossBucket(9, 11, 9.0, 10.0, 2),
    ]
    assert series.validation == [LossBucket(1, 4, 0.25, 0.5, 2), LossBucket(9, 11, 0.75, 0.75, 1)]


def test_a_job_with_fewer_steps_than_ranges_keeps_one_range_a_step(job):
    TrainingEvent.objects.bulk_create(
        [_event(job, 1, step=7, train_loss=1.5), _event(job, 2, step=9, train_loss=1.25)]
    )
    series = job_loss_series(job=job, buckets=1000)
    # Steps 7-9: three ranges of one step, the empty one (8) not drawn.
    assert series.train == [LossBucket(7, 8, 1.5, 1.5, 1), LossBucket(9, 10, 1.25, 1.25, 1)]
    assert series.validation == []


def test_a_job_without_losses_has_no_series(job):
    TrainingEvent.objects.bulk_create([_event(job, 1, message="queued")])
    series = job_loss_series(job=job)
    assert (series.train, series.validation) == ([], [])
