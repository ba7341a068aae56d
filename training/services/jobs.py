"""Creating a job, previewing its requests, and cancelling it."""

from __future__ import annotations

import datetime as dt
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from curation.models import DatasetVersion
from training.jobs import CANCEL_TASK, SUBMISSION
from training.models import TrainingEvent, TrainingJob
from training.providers import ProviderError, provider_for, provider_kind
from training.providers.base import PlannedRequest, UploadFile
from training.providers.http import call_seconds
from training.services.common import (
    Submission,
    _note,
    _provider,
)
from training.services.polling import poll_lease, training_job_poll
from training.upload_files import (
    DataRefused,
    ValidationSource,
    upload_file_build,
    validation_source,
)

# -- create ---------------------------------------------------------------------------------


def training_job_create(
    *, submission: Submission, created_by=None, enqueue: bool = True
) -> TrainingJob:
    job = TrainingJob.objects.create(
        dataset_version=submission.version,
        validation_version=submission.validation_version,
        provider=submission.provider,
        endpoint_name=submission.endpoint_name,
        base_url=submission.base_url,
        api_key_env=submission.api_key_env,
        model=submission.model,
        config_toml=submission.config_text,
        effective_config=submission.config.to_json(),
        idempotency_key=uuid.uuid4().hex,
        created_by=created_by if getattr(created_by, "is_authenticated", False) else None,
        # Without enqueue the caller submits it; the periodic requeue leaves it alone.
        enqueued_at=None if enqueue else timezone.now(),
    )
    _note(job, "created", f"Job saved; {submission.provider} at {submission.base_url}")
    if enqueue:
        SUBMISSION.enqueue_on_commit(job.id)
    return job


def training_job_plan(*, submission: Submission, build_files: bool) -> list[PlannedRequest]:
    """The requests a submission would send, without sending anything (`--dry-run`).

    With `build_files`, the upload files are made and checked as for real, so the sizes and
    sha256 shown are those that would be uploaded (DataRefused when the data is refused).
    """
    provider = provider_for(name=submission.provider, base_url=submission.base_url, api_key="")
    if submission.version is None:
        # A GRPO job: nothing to upload or export, it plays its own episodes.
        return provider.plan(spec=submission.spec(), training=None, validation=None)
    source = validation_source(
        version=submission.version, validation_version=submission.validation_version
    )
    spec = submission.spec(validation_file_id="{validation_file_id}" if source else "")
    if not build_files or not provider_kind(submission.provider).uploads_files:
        return provider.plan(
            spec=spec,
            training=_unbuilt("train", submission.provider, rows=submission.version.rows),
            validation=_unbuilt("val", submission.provider, rows=source.rows) if source else None,
        )
    directory = Path(tempfile.mkdtemp(prefix="studio-dry-run-"))
    try:
        training, validation = _build_files(
            version=submission.version,
            validation=source,
            provider=submission.provider,
            directory=directory,
            label="dry-run",
        )
        return provider.plan(spec=spec, training=training, validation=validation)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _unbuilt(role: str, provider: str, *, rows: int) -> UploadFile:
    name = f"studio-job-{{job_id}}-{role}-{provider}.jsonl"
    return UploadFile(path=Path(), name=name, sha256="", bytes=0, rows=rows)


def _build_files(
    *,
    version: DatasetVersion,
    validation: ValidationSource | None,
    provider: str,
    directory: Path,
    label: str,
    heartbeat: Callable[[], None] | None = None,
) -> tuple[UploadFile, UploadFile | None]:
    problems: list[str] = []
    training = validation_file = None
    try:
        training = upload_file_build(
            version=version,
            provider=provider,
            role="train",
            directory=directory,
            label=label,
            heartbeat=heartbeat,
        )
    except DataRefused as exc:
        problems += exc.lines
    if validation is not None:
        try:
            validation_file = upload_file_build(
                version=validation.version,
                provider=provider,
                role="val",
                directory=directory,
                label=label,
                part=validation.part,
                heartbeat=heartbeat,
            )
        except DataRefused as exc:
            problems += exc.lines
    if problems:
        raise DataRefused(problems)
    assert training is not None
    return training, validation_file


# -- cancel ---------------------------------------------------------------------------------

# A cancel that found its provider down waits this long before its next try, doubling with
# each try up to the second figure (seconds).
CANCEL_BACKOFF_FIRST = 15
CANCEL_BACKOFF_MAX = 600


def cancel_backoff_seconds(tries: int) -> int:
    """The wait after the `tries`-th cancel (from 0) that found the provider down."""
    return min(CANCEL_BACKOFF_MAX, CANCEL_BACKOFF_FIRST * 2 ** min(tries, 10))


def training_job_cancel(*, job: TrainingJob) -> None:
    """Ask for a cancel: at once when nothing remote exists, else through the provider, by
    one cancel task at a time however often it is asked."""
    if job.status in TrainingJob.TERMINAL:
        return
    if TrainingJob.objects.filter(id=job.id, cancel_requested=False).update(cancel_requested=True):
        _note(job, "cancel_requested", "Cancel requested")
    canceled_here = TrainingJob.objects.filter(
        id=job.id, status=TrainingJob.Status.PENDING, remote_job_id=""
    ).update(status=TrainingJob.Status.CANCELED, finished_at=timezone.now())
    if canceled_here:
        return
    _cancel_send(job.id)


def training_cancels_resend() -> int:
    """Send again the cancels asked for that never reached the provider (the broker was
    down, the message was lost, the provider was down and the back-off has passed): the
    row, not the broker, is the truth. Never one whose cancel is queued or running."""
    now = timezone.now()
    ids = list(
        TrainingJob.objects.filter(
            cancel_requested=True,
            status__in=(TrainingJob.Status.SUBMITTED, TrainingJob.Status.RUNNING),
        )
        .exclude(remote_job_id="")
        .filter(Q(cancel_held_until__isnull=True) | Q(cancel_held_until__lte=now))
        .exclude(events__type__in=("studio.cancel_sent", "studio.cancel_failed"))
        .values_list("id", flat=True)
        .distinct()
    )
    return sum(_cancel_send(job_id) for job_id in ids)


def _cancel_send(job_id: int) -> bool:
    """Queue the job's cancel unless one is queued or running already (claimed on the row,
    for as long as a message may wait for a worker); sent once the caller's transaction
    commits. False: another cancel holds the job."""
    token = _cancel_claim(job_id, seconds=settings.STUDIO_REQUEUE_PENDING_SECONDS)
    if token is None:
        return False

    def send() -> None:
        # Through the one send path: with the broker down it is logged, never raised after
        # the commit, and the claim handed back for the beat task to send it again.
        if not SUBMISSION.send(CANCEL_TASK, job_id, token):
            _cancel_release(job_id, token)

    transaction.on_commit(send)
    return True


def _cancel_claim(job_id: int, *, seconds: float, token: str = "") -> str | None:
    """Hold the job's cancel for `seconds`: with `token`, the claim its sender took (None
    once another took it over); without, a new claim if no cancel holds the job."""
    now = timezone.now()
    until = now + dt.timedelta(seconds=seconds)
    if token:
        held = TrainingJob.objects.filter(id=job_id, cancel_token=token)
        return token if held.update(cancel_held_until=until) == 1 else None
    token = uuid.uuid4().hex
    free = TrainingJob.objects.filter(id=job_id).filter(
        Q(cancel_held_until__isnull=True) | Q(cancel_held_until__lte=now)
    )
    return token if free.update(cancel_token=token, cancel_held_until=until) == 1 else None


def _cancel_release(job_id: int, token: str, *, wait: float = 0) -> None:
    """End the cancel that holds the job; `wait`: no other is sent for so long (a back-off)."""
    until = timezone.now() + dt.timedelta(seconds=wait) if wait else None
    TrainingJob.objects.filter(id=job_id, cancel_token=token).update(
        cancel_token="", cancel_held_until=until
    )


def training_job_cancel_remote(*, job_id: int, token: str = "") -> str:
    """Send the job's cancel to its provider, as the one cancel of this job under way.

    `token`: the claim its sender took (`_cancel_send`); without one (the submission ending
    on a job whose cancel was asked for), a claim is taken here. "busy" when another cancel
    holds the job. One request, not retried here: a provider that is down gets the next try
    after a back-off, from the beat task.
    """
    seconds = call_seconds() + poll_lease().total_seconds()  # the cancel, then a poll
    token = _cancel_claim(job_id, seconds=seconds, token=token)
    if token is None:
        return "busy"
    job = TrainingJob.objects.filter(id=job_id).first()
    if job is None or job.status in TrainingJob.TERMINAL or not job.remote_job_id:
        _cancel_release(job_id, token)
        return "skipped"
    try:
        _provider(job, max_retries=0).cancel(remote_job_id=job.remote_job_id)
    except ProviderError as exc:
        if exc.retryable:
            wait = cancel_backoff_seconds(job.cancel_tries)
            _cancel_release(job_id, token, wait=wait)
            TrainingJob.objects.filter(id=job_id).update(cancel_tries=F("cancel_tries") + 1)
            _note(
                job,
                "cancel_retry",
                f"Cancel not sent, tried again in {wait} s: {exc}",
                level=TrainingEvent.Level.WARNING,
            )
            return "retry"
        _cancel_release(job_id, token)
        _note(job, "cancel_failed", f"Cancel failed: {exc}", level=TrainingEvent.Level.ERROR)
        return "failed"
    _cancel_release(job_id, token)
    _note(job, "cancel_sent", "Cancel sent to the provider")
    training_job_poll(job_id=job_id)
    return "sent"
