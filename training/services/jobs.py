"""Creating a job, previewing its requests, and cancelling it."""

from __future__ import annotations

import datetime as dt
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

from django.db import transaction
from django.utils import timezone

from curation.models import DatasetVersion
from training.jobs import CANCEL_TASK, SUBMISSION
from training.models import TrainingEvent, TrainingJob
from training.providers import ProviderError, provider_for
from training.providers.base import PlannedRequest, UploadFile
from training.services.common import (
    Submission,
    _note,
    _provider,
)
from training.services.polling import training_job_poll
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
    source = validation_source(
        version=submission.version, validation_version=submission.validation_version
    )
    spec = submission.spec(validation_file_id="{validation_file_id}" if source else "")
    if not build_files:
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


def training_job_cancel(*, job: TrainingJob) -> None:
    """Ask for a cancel: at once when nothing remote exists, else through the provider."""
    if job.status in TrainingJob.TERMINAL:
        return
    TrainingJob.objects.filter(id=job.id).update(cancel_requested=True)
    _note(job, "cancel_requested", "Cancel requested")
    canceled_here = TrainingJob.objects.filter(
        id=job.id, status=TrainingJob.Status.PENDING, remote_job_id=""
    ).update(status=TrainingJob.Status.CANCELED, finished_at=timezone.now())
    if canceled_here:
        return
    # Through the one send path: with the broker down it is logged, never raised after the
    # commit (the cancel stays asked for on the row).
    transaction.on_commit(lambda: SUBMISSION.send(CANCEL_TASK, job.id))


def training_cancels_resend() -> int:
    """Send again the cancels asked for over a minute ago that never reached the provider
    (the broker was down, or the message was lost): the row, not the broker, is the truth."""
    asked_before = timezone.now() - dt.timedelta(seconds=60)
    ids = list(
        TrainingJob.objects.filter(
            cancel_requested=True,
            status__in=(TrainingJob.Status.SUBMITTED, TrainingJob.Status.RUNNING),
        )
        .exclude(remote_job_id="")
        .filter(events__type="studio.cancel_requested", events__time__lt=asked_before)
        .exclude(events__type__in=("studio.cancel_sent", "studio.cancel_failed"))
        .values_list("id", flat=True)
        .distinct()
    )
    return sum(SUBMISSION.send(CANCEL_TASK, job_id) for job_id in ids)


def training_job_cancel_remote(*, job_id: int) -> str:
    job = TrainingJob.objects.filter(id=job_id).first()
    if job is None or job.status in TrainingJob.TERMINAL or not job.remote_job_id:
        return "skipped"
    try:
        _provider(job).cancel(remote_job_id=job.remote_job_id)
    except ProviderError as exc:
        if exc.retryable:
            return "retry"
        _note(job, "cancel_failed", f"Cancel failed: {exc}", level=TrainingEvent.Level.ERROR)
        return "failed"
    _note(job, "cancel_sent", "Cancel sent to the provider")
    training_job_poll(job_id=job_id)
    return "sent"
