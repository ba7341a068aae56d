"""A `trl` job's run as its provider sees it: created, sent to the `train` queue, asked to
stop, and read (its state, events and metric points) by the poll, as cheap indexed reads.

What a train worker does with the run is `training.local_run_worker`'s.
"""

from __future__ import annotations

import re

from django.db.models import Q
from django.utils import timezone

from training.jobs import LOCAL_RUN
from training.models import LocalRun, LocalRunEvent
from training.providers.base import (
    MAX_EVENTS_PER_POLL,
    MAX_POINTS_PER_POLL,
    ProviderError,
    RemoteEvent,
    RemoteState,
    clean_step,
)

# The provider's id of a run: "local-<run id>".
_RUN_ID = re.compile(r"local-(\d{1,18})")
WAITING = "waiting_for_a_train_worker"
_STATES = {
    LocalRun.Status.PENDING: "submitted",
    LocalRun.Status.RUNNING: "running",
    LocalRun.Status.DONE: "succeeded",
    LocalRun.Status.FAILED: "failed",
    LocalRun.Status.CANCELED: "canceled",
}


def trained_model_name(job_id: int) -> str:
    """The name the studio gives a trl job's model (what `serve_model` serves it as)."""
    return f"trl-job-{job_id}"


def run_remote_id(run: LocalRun) -> str:
    return f"local-{run.id}"


def _run_pk(remote_job_id: str) -> int:
    match = _RUN_ID.fullmatch(remote_job_id or "")
    if match is None:
        raise ProviderError(f"trl: {remote_job_id[:80]!r} is not a local run's id")
    return int(match.group(1))


def local_run_create(*, job_id: int) -> str:
    """The job's run (one per job, however often asked): its provider id."""
    run, _ = LocalRun.objects.get_or_create(job_id=job_id)
    return run_remote_id(run)


def local_run_start(*, remote_job_id: str) -> None:
    """Send the run to the `train` queue; a broker that is down leaves it for the requeue."""
    LOCAL_RUN.enqueue_on_commit(_run_pk(remote_job_id))


def local_run_cancel(*, remote_job_id: str) -> None:
    """Ask the run to stop: its worker reads this after every step; a run no worker has
    claimed yet ends here (it is never claimed once asked)."""
    pk = _run_pk(remote_job_id)
    LocalRun.objects.filter(pk=pk).update(cancel_requested=True)
    LocalRun.objects.filter(pk=pk, status=LocalRun.Status.PENDING).update(
        status=LocalRun.Status.CANCELED, finished_at=timezone.now()
    )


def _run(remote_job_id: str) -> LocalRun:
    run = LocalRun.objects.filter(pk=_run_pk(remote_job_id)).first()
    if run is None:
        raise ProviderError(f"trl: no local run {remote_job_id!r}")
    return run


def local_run_state(*, remote_job_id: str) -> RemoteState:
    """The run's state as a provider reports one (one read by primary key)."""
    run = _run(remote_job_id)
    status = _STATES.get(run.status, "running")
    if run.status == LocalRun.Status.PENDING:
        remote = WAITING
    elif run.status == LocalRun.Status.RUNNING:
        remote = "training"
    else:
        remote = str(run.status)
    return RemoteState(
        status=status,
        remote_status=remote,
        fine_tuned_model=run.fine_tuned_model if status == "succeeded" else "",
        error=run.error if status == "failed" else "",
    )


def local_run_events(*, remote_job_id: str, cursor: str) -> tuple[list[RemoteEvent], str]:
    """The run's events after `cursor` (the last event's number read), a poll's worth."""
    after = int(cursor) if cursor.isdigit() else 0
    rows = list(
        LocalRunEvent.objects.filter(
            run_id=_run_pk(remote_job_id), kind=LocalRunEvent.Kind.EVENT, id__gt=after
        ).order_by("id")[:MAX_EVENTS_PER_POLL]
    )
    events = [
        RemoteEvent(
            remote_id=f"run:{row.id}",
            time=row.time,
            level=row.level,
            type=row.type,
            message=row.message,
            step=clean_step(row.data.get("step")) if isinstance(row.data, dict) else None,
            data=row.data if isinstance(row.data, dict) else {},
        )
        for row in rows
    ]
    return events, str(rows[-1].id if rows else after)


def local_run_metrics(*, remote_job_id: str, after: int) -> tuple[list[RemoteEvent], int]:
    """The run's metric points after `after` (the last point's number read, not a step: a
    step's validation point may be written after its training point was read)."""
    rows = list(
        LocalRunEvent.objects.filter(
            Q(id__gt=after), run_id=_run_pk(remote_job_id), kind=LocalRunEvent.Kind.METRIC
        ).order_by("id")[:MAX_POINTS_PER_POLL]
    )
    points = []
    for row in rows:
        validation = row.name == "validation"
        points.append(
            RemoteEvent(
                remote_id=f"metric:{row.name}:{row.step}",
                time=row.time,
                type="metric",
                message=f"{row.name} loss = {row.value:.6g} at step {row.step}",
                step=row.step,
                train_loss=None if validation else row.value,
                validation_loss=row.value if validation else None,
                data={"name": row.name, "value": row.value},
            )
        )
    return points, (rows[-1].id if rows else after)
