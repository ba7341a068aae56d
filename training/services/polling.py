"""Following a remote job: its state, new events and metrics, stored once each."""

from __future__ import annotations

import datetime as dt
import logging
import uuid

from django.conf import settings
from django.core.cache import cache
from django.db.models import Q
from django.utils import timezone

from studio.jobs import error_cut
from training.models import TrainingEvent, TrainingJob
from training.providers import ProviderError
from training.providers.base import REQUESTS_PER_POLL, RemoteEvent, RemoteState, model_id
from training.providers.http import call_seconds
from training.providers.synth import terminal_event_status
from training.services.common import EndpointStopped, _fail, _note, _provider

logger = logging.getLogger(__name__)

# -- poll -----------------------------------------------------------------------------------


def poll_lease() -> dt.timedelta:
    """How long a poll may hold its job (and the beat task all polls): longer than the most
    requests a poll makes (`REQUESTS_PER_POLL`, none retried: the next poll is the retry)
    can last, each cut at its deadline, so its job is never handed to a second poll
    meanwhile."""
    return dt.timedelta(seconds=REQUESTS_PER_POLL * call_seconds() + 30)


def training_job_poll(*, job_id: int, due: dt.datetime | None = None) -> str:
    """Ask the provider once, as the one poll of this job under way: new events and metrics
    are stored, the status follows.

    The job is claimed first (its `polled_at` set past the poll's longest): "busy" while
    another poll holds it, whoever asked (the beat task, a cancel, `submit_training
    --wait`). `due`: poll only a job last polled before then (the beat task's round).
    """
    now = timezone.now()
    claimed = (
        TrainingJob.objects.filter(id=job_id, submitted_at__isnull=False)
        .exclude(status__in=TrainingJob.TERMINAL)
        .exclude(remote_job_id="")
        .filter(Q(polled_at__isnull=True) | Q(polled_at__lte=due or now))
        .update(polled_at=now + poll_lease())
    )
    if not claimed:
        held = TrainingJob.objects.filter(id=job_id, polled_at__gt=now).exists()
        return "busy" if held else "skipped"
    try:
        return _poll_claimed(TrainingJob.objects.get(id=job_id))
    except Exception:
        TrainingJob.objects.filter(id=job_id).update(polled_at=timezone.now())
        raise


def _poll_claimed(job: TrainingJob) -> str:
    try:
        provider = _provider(job, max_retries=0)
        # State first: the events read after it include everything up to that state.
        state = provider.state(remote_job_id=job.remote_job_id)
        events, cursor = provider.events(remote_job_id=job.remote_job_id, cursor=job.event_cursor)
        metrics, after = provider.metrics(
            remote_job_id=job.remote_job_id, after_step=job.metric_cursor
        )
        fields = _poll_fields(job, state=state, events=events)
    except EndpointStopped as exc:
        _fail(job, str(exc))
        return "failed"
    except ProviderError as exc:
        return _poll_failed(job, exc)
    _store_events(job, events + metrics)
    fields.update(event_cursor=cursor, metric_cursor=after)
    TrainingJob.objects.filter(id=job.id).exclude(status__in=TrainingJob.TERMINAL).update(**fields)
    return str(fields.get("status", job.status))


def _poll_failed(job: TrainingJob, exc: ProviderError) -> str:
    """A provider that is down is waited for; one answering nonsense fails the job after
    STUDIO_TRAINING_POLL_FAILURES polls in a row, with one line."""
    now = timezone.now()
    if exc.retryable:
        TrainingJob.objects.filter(id=job.id).update(polled_at=now)
        return "retry"
    failures = job.poll_failures + 1
    limit = settings.STUDIO_TRAINING_POLL_FAILURES
    if failures >= limit:
        _fail(job, f"Polling failed {failures} times in a row; the last: {exc}")
        return "failed"
    TrainingJob.objects.filter(id=job.id).update(polled_at=now, poll_failures=failures)
    logger.warning("training job %s: poll %s of %s failed: %s", job.id, failures, limit, exc)
    return "retry"


def _poll_fields(job: TrainingJob, *, state: RemoteState, events: list[RemoteEvent]) -> dict:
    """The job's fields after a poll that read `state` and `events` (ProviderError: an event
    names an unusable model)."""
    now = timezone.now()
    status = state.status
    model = state.fine_tuned_model
    for event in events:
        ended = terminal_event_status(event)
        if ended and status not in TrainingJob.TERMINAL:
            status = ended
        model = model or model_id(event.data.get("fine_tuned_model"), "the provider's event")
    fields: dict = {"remote_status": state.remote_status, "polled_at": now, "poll_failures": 0}
    if model:
        fields["fine_tuned_model"] = model
    if state.trained_tokens is not None:
        fields["trained_tokens"] = state.trained_tokens
    if status == "succeeded" and not (model or job.fine_tuned_model):
        # Reported done, yet no model to evaluate: read the status again until it names one.
        reported = job.success_reported_at or now
        fields["success_reported_at"] = reported
        waited = (now - reported).total_seconds()
        if waited < settings.STUDIO_TRAINING_MODEL_WAIT_SECONDS:
            status = "running"
        else:
            status = "failed"
            fields["error"] = (
                f"the provider reported success but gave no model id (asked for "
                f"{waited:.0f} s); Refresh asks again"
            )
    if status == "running" and job.started_at is None:
        fields["started_at"] = now
    if status in ("running", "submitted"):
        fields["status"] = status
    if status in TrainingJob.TERMINAL:
        fields["status"] = status
        fields["finished_at"] = now
        if status == "succeeded":
            fields["error"] = ""  # an outage it came through is no longer an error
        if status == "failed" and "error" not in fields:
            failures = [e.message for e in events if e.level == "error" and e.message]
            error = state.error or "\n".join(failures) or "The provider failed the job"
            fields["error"] = error_cut(error)
    return fields


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
    """The beat task: poll every active job with a remote id not polled in the last interval.

    One of these runs at a time (a lease in the cache), so following training holds at most
    one worker thread, for at most `poll_lease()` per job, whatever the providers do.
    """
    lease = poll_lease()
    token = uuid.uuid4().hex
    if not _lease_take(token, lease):
        return 0
    try:
        return _poll_due(lease, token)
    finally:
        _lease_give_back(token)


def _poll_due(lease: dt.timedelta, token: str) -> int:
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
        _lease_renew(token, lease)
        try:
            outcome = training_job_poll(job_id=job_id, due=due)
        except Exception:
            # One broken job must not stop the others being followed.
            logger.exception("training job %s: poll failed", job_id)
            outcome = "failed"
        polled += outcome not in ("busy", "skipped")
    return polled


_LEASE_KEY = "training-polls-running"


def _lease_take(token: str, lease: dt.timedelta) -> bool:
    """Taken for one job's poll at a time (renewed before each): a task killed mid-way
    holds the polls back for one lease at most."""
    try:
        return cache.add(_LEASE_KEY, token, timeout=lease.total_seconds())
    except Exception as exc:  # the cache is down: poll anyway, the per-job lease still holds
        logger.warning("training polls: the cache is unreachable (%s)", type(exc).__name__)
        return True


def _lease_renew(token: str, lease: dt.timedelta) -> None:
    try:
        cache.set(_LEASE_KEY, token, timeout=lease.total_seconds())
    except Exception:
        logger.warning("training polls: the cache is unreachable; the lease was not renewed")


def _lease_give_back(token: str) -> None:
    try:
        if cache.get(_LEASE_KEY) == token:
            cache.delete(_LEASE_KEY)
    except Exception:
        logger.warning("training polls: could not give the lease back; it expires by itself")


def training_job_refresh(*, job_id: int) -> str:
    """Read the status of a job the provider called succeeded without naming its model.

    "succeeded" once the status names the model; else the job stays as it is, with a note.
    """
    job = TrainingJob.objects.filter(id=job_id).first()
    if job is None or not job.needs_model_refresh:
        return "skipped"
    try:
        state = _provider(job, max_retries=0).state(remote_job_id=job.remote_job_id)
    except ProviderError as exc:
        _note(job, "refresh_failed", f"Refresh failed: {exc}", level=TrainingEvent.Level.ERROR)
        return "failed"
    if not state.fine_tuned_model:
        _note(job, "refreshed", f"Still no model id (remote status {state.remote_status!r})")
        return "no_model"
    TrainingJob.objects.filter(id=job.id, status=TrainingJob.Status.FAILED).update(
        status=TrainingJob.Status.SUCCEEDED,
        fine_tuned_model=state.fine_tuned_model,
        remote_status=state.remote_status,
        error="",
        finished_at=timezone.now(),
    )
    _note(job, "refreshed", f"The provider names the model now: {state.fine_tuned_model}")
    return "succeeded"
