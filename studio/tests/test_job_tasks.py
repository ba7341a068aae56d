"""Every job kind's task is declared by `studio.jobs.job_task`: one set of options, and one
retry policy (`JobKind.run_in_task`), a provider's capped retries included."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from celery.exceptions import Retry

from studio import jobs
from studio.celery import app
from training.jobs import SUBMISSION


def test_each_kind_task_is_named_limited_and_acknowledged_late():
    app.loader.import_default_modules()
    for kind in jobs.job_kinds():
        task = app.tasks[kind.task]
        assert task.acks_late and task.reject_on_worker_lost, kind.name
        assert task.soft_time_limit == int(kind.hours * 3600), kind.name
        assert task.time_limit == task.soft_time_limit + 120, kind.name


class _Task:
    """What `run_in_task` reads of a bound task, and its `retry` recorded."""

    def __init__(self, retries: int, kwargs: dict[str, Any] | None = None) -> None:
        self.request = SimpleNamespace(retries=retries, kwargs=kwargs or {})
        self.retried: dict[str, Any] = {}

    def retry(self, **options: Any) -> Exception:
        self.retried = options
        return Retry()


@pytest.mark.parametrize("retries, countdown", [(0, 5), (1, 15), (4, 300)])
def test_a_provider_retry_waits_the_kind_countdown(retries, countdown):
    task = _Task(retries)
    seen: list[bool] = []

    def work(*, last_attempt: bool) -> jobs.JobOutcome:
        seen.append(last_attempt)
        return "retry"

    with pytest.raises(Retry):
        SUBMISSION.run_in_task(task, work)
    assert seen == [False]
    assert task.retried["countdown"] == countdown
    assert task.retried["max_retries"] == len(SUBMISSION.retry_countdowns)


def test_the_last_try_is_told_and_outages_count_against_no_provider_retry():
    countdowns = len(SUBMISSION.retry_countdowns)
    seen: list[bool] = []

    def work(*, last_attempt: bool) -> jobs.JobOutcome:
        seen.append(last_attempt)
        return "failed"

    assert SUBMISSION.run_in_task(_Task(countdowns), work) == "failed"
    # Two of these tries were outages of our own: not the last provider try yet.
    assert SUBMISSION.run_in_task(_Task(countdowns, {"outages": 2}), work) == "failed"
    assert seen == [True, False]


def test_an_outage_is_retried_and_counted_in_the_message():
    from django.db import OperationalError

    task = _Task(3, {"outages": 1})

    def work(*, last_attempt: bool) -> jobs.JobOutcome:
        raise OperationalError("server closed the connection unexpectedly")

    with pytest.raises(Retry):
        SUBMISSION.run_in_task(task, work)
    assert task.retried["kwargs"] == {"outages": 2}
    assert task.retried["max_retries"] == 4
