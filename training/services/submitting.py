"""Submitting a job to its provider: one task, safe to run twice.

Submission is one task that is safe to run twice. It claims the job with a conditional
UPDATE and a token; every remote id is written the moment the provider returns it; a second
delivery (a retry, or a worker killed mid-way) finds those ids and carries on from there, so
it never uploads a file again nor creates a second remote job. Keys are read from the
worker's environment at the moment of the call, never stored or logged.
"""

from __future__ import annotations

import datetime as dt
import logging
import shutil
import tempfile
from pathlib import Path

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from studio import claims, queue
from training.config import TrainingConfig
from training.models import TrainingEvent, TrainingJob
from training.providers import ProviderError
from training.providers.base import JobSpec
from training.services.common import (
    ERROR_CHARS,
    SubmitOutcome,
    _fail,
    _finish,
    _note,
    _provider,
    job_metadata,
)
from training.services.jobs import _build_files, training_job_cancel_remote
from training.upload_files import DataRefused, validation_source

logger = logging.getLogger(__name__)

# -- submit ---------------------------------------------------------------------------------


def _stale_after() -> dt.timedelta:
    """How long an uploading job's worker may stay silent before it is presumed dead."""
    return dt.timedelta(seconds=settings.STUDIO_TRAINING_STALE_SECONDS)


def _claim(*, job_id: int) -> str | None:
    # `started_at` is when the provider reports the remote job running, not this claim.
    return claims.job_claim(
        model=TrainingJob,
        pk=job_id,
        stale_after=_stale_after(),
        working=TrainingJob.Status.UPLOADING,
        where=Q(cancel_requested=False),
        stamp_start=False,
        attempts=F("attempts") + 1,
    )


def _save_mine(job_id: int, token: str, **fields) -> bool:
    """Write fields only while this worker still holds the claim."""
    return claims.job_heartbeat(
        model=TrainingJob,
        pk=job_id,
        token=token,
        working=TrainingJob.Status.UPLOADING,
        **fields,
    )


def training_job_submit(*, job_id: int, last_attempt: bool = False) -> SubmitOutcome:
    """Upload, create and start the remote job. Safe to run twice: the row says what exists.

    A provider that is down (429, 5xx, network) gives "retry" unless `last_attempt`, when
    the job fails with that error instead of waiting forever.
    """
    token = _claim(job_id=job_id)
    if token is None:
        job = TrainingJob.objects.filter(id=job_id).first()
        if job is None:
            return "done_already"
        if (
            job.cancel_requested
            and job.status
            in (
                TrainingJob.Status.PENDING,
                TrainingJob.Status.UPLOADING,
            )
            and not job.remote_job_id
        ):
            _finish(job, status=TrainingJob.Status.CANCELED, error="")
            return "canceled"
        return "busy" if job.status == TrainingJob.Status.UPLOADING else "done_already"
    job = TrainingJob.objects.select_related("dataset_version", "validation_version").get(id=job_id)
    try:
        return _submit_claimed(job, token)
    except ClaimLost:
        return "busy"
    except ProviderError as exc:
        if exc.retryable and not last_attempt:
            # Hand the claim back at once; the task tries again after a backoff.
            TrainingJob.objects.filter(id=job_id, claim_token=token).update(
                status=TrainingJob.Status.PENDING, claim_token="", error=str(exc)[:ERROR_CHARS]
            )
            _note(job, "retry", f"Will retry: {exc}", level=TrainingEvent.Level.WARNING)
            return "retry"
        _fail(job, str(exc), token=token)
        return "failed"
    except Exception as exc:
        # A poison job is set aside with its error, never crash-looped.
        logger.exception("training job %s: submission failed", job_id)
        _fail(job, f"{type(exc).__name__}: {exc}", token=token)
        return "failed"


class ClaimLost(Exception):
    """Another delivery took the job over (this one was presumed dead): stop here."""


def _submit_claimed(job: TrainingJob, token: str) -> SubmitOutcome:
    provider = _provider(job)

    def heartbeat() -> None:
        if not _save_mine(job.id, token):
            raise ClaimLost

    source = validation_source(
        version=job.dataset_version, validation_version=job.validation_version
    )
    # A job created remotely without one (before versions' splits were sent) stays so.
    wants_validation = source is not None and not job.remote_job_id
    directory = Path(tempfile.mkdtemp(prefix=f"studio-training-{job.id}-"))
    try:
        if not job.remote_training_file_id or (
            wants_validation and not job.remote_validation_file_id
        ):
            try:
                training, validation = _build_files(
                    version=job.dataset_version,
                    validation=source if wants_validation else None,
                    provider=job.provider,
                    directory=directory,
                    label=f"studio-job-{job.id}",
                    heartbeat=heartbeat,
                )
            except DataRefused as exc:
                _fail(job, "The data was refused before upload:\n" + "\n".join(exc.lines), token)
                return "failed"
            if not job.remote_training_file_id:
                _note(job, "upload", f"Uploading {training.rows} rows ({training.bytes} bytes)")
                file_id = provider.upload(file=training, idempotency_key=f"{job.idempotency_key}-t")
                _save_mine(
                    job.id,
                    token,
                    remote_training_file_id=file_id,
                    training_file_sha256=training.sha256,
                    training_file_bytes=training.bytes,
                    training_file_rows=training.rows,
                )
                job.remote_training_file_id = file_id
                _note(job, "uploaded", f"Training file {file_id} (sha256 {training.sha256})")
            if validation is not None and not job.remote_validation_file_id:
                file_id = provider.upload(
                    file=validation, idempotency_key=f"{job.idempotency_key}-v"
                )
                _save_mine(
                    job.id,
                    token,
                    remote_validation_file_id=file_id,
                    validation_file_sha256=validation.sha256,
                    validation_file_bytes=validation.bytes,
                    validation_file_rows=validation.rows,
                )
                job.remote_validation_file_id = file_id
                assert source is not None
                origin = (
                    f"the validation split of version {source.version.id}"
                    if source.is_split
                    else f"validation version {source.version.id}"
                )
                _note(
                    job,
                    "uploaded",
                    f"Validation file {file_id}: {validation.rows} rows from {origin} "
                    f"(sha256 {validation.sha256})",
                )
    finally:
        shutil.rmtree(directory, ignore_errors=True)

    if not job.remote_job_id:
        spec = JobSpec(
            config=TrainingConfig(sections=_sections(job.effective_config)),
            model=job.model,
            training_file_id=job.remote_training_file_id,
            validation_file_id=job.remote_validation_file_id,
            metadata=job_metadata(job_id=str(job.id), idempotency_key=job.idempotency_key),
        )
        remote_id = ""
        job.refresh_from_db(fields=["create_attempts", "cancel_requested"])
        if job.cancel_requested:
            _finish(job, status=TrainingJob.Status.CANCELED, error="")
            return "canceled"
        if job.create_attempts and hasattr(provider, "find_job"):
            # A worker died between the provider's answer and saving it: look first.
            remote_id = provider.find_job(idempotency_key=job.idempotency_key)
        if not remote_id:
            _save_mine(job.id, token, create_attempts=job.create_attempts + 1)
            remote_id = provider.create_job(spec=spec, idempotency_key=job.idempotency_key)
        _save_mine(job.id, token, remote_job_id=remote_id)
        job.remote_job_id = remote_id
        _note(job, "created_remote", f"Remote job {remote_id} created")

    if job.submitted_at is None:
        provider.start_job(remote_job_id=job.remote_job_id)
        now = timezone.now()
        if not _save_mine(
            job.id, token, status=TrainingJob.Status.SUBMITTED, submitted_at=now, claim_token=""
        ):
            return "busy"
        _note(job, "started", "Job started")
    job.refresh_from_db()
    if job.cancel_requested:
        training_job_cancel_remote(job_id=job.id)
    return "submitted"


def _sections(effective: dict) -> dict[str, dict]:
    return {name: dict(values) for name, values in (effective or {}).items()}


def training_jobs_requeue_stale() -> list[int]:
    """Send the submission task again for jobs whose worker died or whose message was lost.

    A job uploading without a heartbeat for the stale window, or pending with its message
    never sent (the broker was down) or long lost: the claim decides who works on it, so a
    duplicate delivery is harmless. Returns the ids sent.
    """
    from training.tasks import training_job_submit as task

    ids = claims.jobs_to_resend(
        rows=TrainingJob.objects.filter(cancel_requested=False),
        stale_after=_stale_after(),
        working=TrainingJob.Status.UPLOADING,
    )
    return ids[: queue.resend(TrainingJob, task, ids)]
