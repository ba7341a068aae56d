"""The test support module: a wait returns what it waited for, or fails saying where it stands."""

from __future__ import annotations

import itertools

import pytest
from django.utils import timezone

from rollouts.models import TurnBulkFlag
from studio.testing import JOB_ENDS, backdate, wait_for_row, wait_until


def test_wait_until_returns_the_first_true_answer():
    answers = itertools.chain([0, None, ""], itertools.repeat("ready"))
    assert wait_until(lambda: next(answers), timeout=5, every=0) == "ready"


def test_wait_until_fails_saying_what_it_waited_for():
    with pytest.raises(AssertionError, match=r"waited 0.1 s for the moon"):
        wait_until(lambda: False, timeout=0.1, what=lambda: "the moon")


@pytest.fixture
def job(db) -> TurnBulkFlag:
    return TurnBulkFlag.objects.create(filters={}, flagged=True, status="running", error="boom")


def test_wait_for_row_fails_with_the_rows_status_and_error(job):
    with pytest.raises(AssertionError) as failure:
        wait_for_row(TurnBulkFlag, job.id, statuses=JOB_ENDS, timeout=0.1)
    assert f"TurnBulkFlag {job.id}" in str(failure.value)
    assert "it is 'running' (error: 'boom')" in str(failure.value)


def test_wait_for_row_refreshes_an_instance_and_asks_between_reads(job):
    asked = []

    def finish() -> None:
        asked.append(1)
        TurnBulkFlag.objects.filter(id=job.id).update(status="done")

    assert wait_for_row(job, statuses="done", timeout=5, while_waiting=finish) is job
    assert job.status == "done" and asked == [1]


def test_backdate_moves_a_time_into_the_past_in_the_database(job):
    backdate(job, field="heartbeat_at", seconds=600)
    stored = TurnBulkFlag.objects.get(id=job.id).heartbeat_at
    assert stored == job.heartbeat_at
    assert 599 < (timezone.now() - stored).total_seconds() < 660
