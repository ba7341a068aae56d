"""Following a remote job: its state, new events and metrics, stored once each."""

from __future__ import annotations

import datetime as dt
import logging

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from training.models import TrainingEvent, TrainingJob
from training.providers import ProviderError
from training.providers.base import RemoteEvent
from training.providers.synth import terminal_event_status
from training.services.common import ERROR_CHARS, _fail, _provider

logger = logging.getLogger(__name__)

# -- poll -----------------------------------------------------------------------------------


def training_job_poll(*, job_id: int) -> str:
    """Ask the provider once: new events and metrics are stored, the status follows."""
    job = TrainingJob.objects.filter(id=job_id).first()
    if job is None or not job.remote_job_id or job.status in TrainingJob.TERMINAL:
        return "skipped"
    if job.submitted_at is None:
        return "skipped"  # the submission task has not finished starting it
    try:
        provider = _provider(job)
        # State first: the events read after it include everything up to that state.
        state = provider.state(remote_job_id=job.remote_job_id)
        events, cursor = provider.events(remote_job_id=job.remote_job_id, cursor=job.event_cursor)
        metrics, after = provider.metrics(
            remote_job_id=job.remote_job_id, after_step=job.metric_cursor
        )
    except ProviderError as exc:
        TrainingJob.objects.filter(id=job.id).update(polled_at=timezone.now())
        if exc.retryable:
            return "retry"
        _fail(job, f"Polling failed: {exc}")
        return "failed"
    _store_events(job, events + metrics)
    status = state.status
    for event in events:
        ended = terminal_event_status(event)
        if ended and status not in ("succeeded", "failed", "canceled"):
            status = ended
    fields: dict = {
        "event_cursor": cursor,
        "metric_cursor": after,
        "remote_status": state.remote_status,
        "polled_at": timezone.now(),
    }
    if state.fine_tuned_model:
        fields["fine_tuned_model"] = state.fine_tuned_model
    if state.trained_tokens is not None:
        fields["trained_tokens"] = state.trained_tokens
    if status == "running" and job.started_at is None:
        fields["started_at"] = timezone.now()
    if status in ("running", "submitted"):
        fields["status"] = status
    if status in ("succeeded", "failed", "canceled"):
        fields["status"] = status
        fields["finished_at"] = timezone.now()
        if status == "failed":
            failures = [e.message for e in events if e.level == "error" and e.message]
            fields["error"] = (state.error or "\n".join(failures) or "The provider failed the job")[
                :ERROR_CHARS
            ]
    TrainingJob.objects.filter(id=job.id).exclude(status__in=TrainingJob.TERMINAL).update(**fields)
    return str(fields.get("status", job.status))


def _store_events(job: TrainingJob, events: list[RemoteEvent]) -> None:
    if not events:
        return
    TrainingEvent.objects.bulk_create(
        [
            TrainingEvent(
                job=job,
                remote_id=e.remote_id,
                time=e.time,
                level=e.level,
                type=e.type,
                message=e.message,
                step=e.step,
                train_loss=e.train_loss,
                validation_loss=e.validation_loss,
                data=e.data,
            )
            for e in events
        ],
        ignore_conflicts=True,  # (job, remote_id) is unique: a repeated poll adds nothing
    )


def training_jobs_poll_active() -> int:
    """The beat task: poll every active job with a remote id not polled in the last interval."""
    now = timezone.now()
    due = now - dt.timedelta(seconds=settings.STUDIO_TRAINING_POLL_SECONDS / 2)
    ids = list(
        TrainingJob.objects.filter(
            status__in=(TrainingJob.Status.SUBMITTED, TrainingJob.Status.RUNNING),
        )
        .exclude(remote_job_id="")
        .filter(Q(polled_at__isnull=True) | Q(polled_at__lt=due))
        .values_list("id", flat=True)
    )
    polled = 0
    for job_id in ids:
        # Claim this round's poll: two beat ticks never ask twice at once.
        if (
            TrainingJob.objects.filter(id=job_id)
            .filter(Q(polled_at__isnull=True) | Q(polled_at__lt=due))
            .update(polled_at=now)
            == 1
        ):
            try:
                training_job_poll(job_id=job_id)
            except Exception:
                # One broken job must not stop the others being followed.
                logger.exception("training job %s: poll failed", job_id)
            polled += 1
    return polled
