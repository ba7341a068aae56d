"""Claiming a job's row: the one way a worker takes, renews, ends and re-sends long work.

A job row (`studio.models.ClaimedJob`, or an episode) is worked on only by the worker that
holds its claim: a token written by one conditional UPDATE that succeeds only while the row
is pending, or is being worked on with a heartbeat older than the job's stale window (its
worker died). Every later write goes through the token, so a worker presumed dead that wakes
up finds its writes refused (`False`) and stops; a second message for the same row finds it
claimed or ended and does nothing. Which status means "being worked on" is the job's own
(`working`: "uploading" for a training submission), as is the stale window.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import Model, Q, QuerySet
from django.utils import timezone

PENDING = "pending"
RUNNING = "running"
DONE = "done"
FAILED = "failed"


def job_claim(
    *,
    model: type[Model],
    pk: int,
    stale_after: timedelta,
    working: str = RUNNING,
    where: Q | None = None,
    stamp_start: bool = True,
    **fields: Any,
) -> str | None:
    """Take the row if it is pending, or `working` with a heartbeat older than `stale_after`.

    Returns the new claim token, or None when another worker holds a fresh claim or the job
    has ended. `where` narrows what may be claimed (a cancel asked for); `fields` are the
    job's own resets written with the claim; `stamp_start` dates `started_at`.
    """
    now = timezone.now()
    token = uuid.uuid4().hex
    rows = model.objects.filter(pk=pk).filter(
        Q(status=PENDING) | Q(status=working, heartbeat_at__lt=now - stale_after)
    )
    if where is not None:
        rows = rows.filter(where)
    if stamp_start:
        fields["started_at"] = now
    claimed = rows.update(status=working, claim_token=token, heartbeat_at=now, **fields)
    return token if claimed == 1 else None


def job_held(*, model: type[Model], pk: int, token: str, working: str = RUNNING) -> QuerySet:
    """The row, while the worker holding `token` still works on it (else nothing)."""
    return model.objects.filter(pk=pk, claim_token=token, status=working)


def job_heartbeat(
    *, model: type[Model], pk: int, token: str, working: str = RUNNING, **fields: Any
) -> bool:
    """Renew the claim, writing `fields` (progress) with it; False: the claim was lost."""
    held = job_held(model=model, pk=pk, token=token, working=working)
    return held.update(heartbeat_at=timezone.now(), **fields) == 1


def job_finish(
    *,
    model: type[Model],
    pk: int,
    token: str,
    status: str = DONE,
    working: str = RUNNING,
    **fields: Any,
) -> bool:
    """End the job as `status` with its results in `fields`; False: the claim was lost."""
    now = timezone.now()
    held = job_held(model=model, pk=pk, token=token, working=working)
    return held.update(status=status, finished_at=now, heartbeat_at=now, **fields) == 1


def job_fail(
    *,
    model: type[Model],
    pk: int,
    token: str,
    error: str,
    working: str = RUNNING,
    **fields: Any,
) -> bool:
    """End the job as failed with `error` (already cut to the job's limit): a poison job is
    set aside, never retried. False: the claim was lost."""
    return job_finish(
        model=model, pk=pk, token=token, status=FAILED, working=working, error=error, **fields
    )


def jobs_stale(*, rows: QuerySet, stale_after: timedelta, working: str = RUNNING) -> list[int]:
    """Ids of rows being worked on whose heartbeat is older than `stale_after`."""
    stale = timezone.now() - stale_after
    return list(rows.filter(status=working, heartbeat_at__lt=stale).values_list("pk", flat=True))


def jobs_waiting(*, rows: QuerySet, created_field: str = "created_at") -> list[int]:
    """Ids of pending rows whose message never left (after a grace for on_commit to send it),
    or left long ago without a worker starting them (a message lost with the broker's data)."""
    now = timezone.now()
    grace = now - timedelta(seconds=settings.STUDIO_REQUEUE_GRACE_SECONDS)
    lost = now - timedelta(seconds=settings.STUDIO_REQUEUE_PENDING_SECONDS)
    never_sent = Q(enqueued_at__isnull=True, **{f"{created_field}__lt": grace})
    return list(
        rows.filter(status=PENDING)
        .filter(never_sent | Q(enqueued_at__lt=lost))
        .values_list("pk", flat=True)
    )


def jobs_to_resend(*, rows: QuerySet, stale_after: timedelta, working: str = RUNNING) -> list[int]:
    """Ids the periodic requeue sends again: stale ones first (a worker died), then those
    waiting for a message (`studio.queue.resend` sends them and dates `enqueued_at`)."""
    return jobs_stale(rows=rows, stale_after=stale_after, working=working) + jobs_waiting(rows=rows)
