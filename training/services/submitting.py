"""Submitting a job to its provider: one task, safe to run twice.

Submission is one task that is safe to run twice. It claims the job with a conditional
UPDATE and a token; every remote id is written the moment the provider returns it; a second
delivery (a retry, or a worker killed mid-way) finds those ids and carries on from there, so
it never uploads a file again nor creates a second remote job. Keys are read from the
worker's environment at the moment of the call, never stored or logged.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

from django.db.models import F
from django.utils import timezone

from studio.claims import Claim
from studio.jobs import ClaimLost, JobOutcome, error_cut
from training.config import TrainingConfig
from training.jobs import SUBMISSION
from training.models import TrainingEvent, TrainingJob
from training.providers import Provider, ProviderError, provider_kind
from training.providers.base import JobSpec, UploadFile
from training.services.common import _fail, _finish, _note, _provider, job_metadata
from training.services.jobs import _build_files, training_job_cancel_remote
from training.upload_files import DataRefused, ValidationSource, validation_source

logger = logging.getLogger(__name__)

# -- submit ---------------------------------------------------------------------------------


def training_job_submit(*, job_id: int, last_attempt: bool = False) -> JobOutcome:
    """Upload, create and start the remote job. Safe to run twice: the row says what exists.

    A provider that is down (429, 5xx, network) gives "retry" unless `last_attempt`, when
    the job fails with that error instead of waiting forever.
    """
    token = SUBMISSION.claim(job_id, attempts=F("attempts") + 1)
    if token is None:
        return _unclaimed(job_id)
    claim = SUBMISSION.held(job_id, token)
    job = TrainingJob.objects.select_related("dataset_version", "validation_version").get(id=job_id)
    try:
        return _submit_claimed(job, claim)
    except ClaimLost:
        return "busy"
    except ProviderError as exc:
        if exc.retryable and not last_attempt:
            # Hand the claim back at once; the task tries again after a backoff.
            claim.release(error=error_cut(str(exc)))
            _note(job, "retry", f"Will retry: {exc}", level=TrainingEvent.Level.WARNING)
            return "retry"
        _fail(job, str(exc), claim=claim)
        return "failed"
    except Exception as exc:
        # A poison job is set aside with its error, never crash-looped.
        logger.exception("training job %s: submission failed", job_id)
        _fail(job, f"{type(exc).__name__}: {exc}", claim=claim)
        return "failed"


def _unclaimed(job_id: int) -> JobOutcome:
    """Why the claim failed; a cancel asked for before anything remote existed ends it here
    (such a job is never claimed again)."""
    job = TrainingJob.objects.filter(id=job_id).first()
    if (
        job is not None
        and job.cancel_requested
        and job.status in (TrainingJob.Status.PENDING, TrainingJob.Status.UPLOADING)
        and not job.remote_job_id
    ):
        _finish(job, status=TrainingJob.Status.CANCELED, error="")
        return "canceled"
    return SUBMISSION.unclaimed(job_id)


def _submit_claimed(job: TrainingJob, claim: Claim) -> JobOutcome:
    """The submission's steps, each skipped when the row says it was done: upload the files,
    create the remote job, start it."""
    provider = _provider(job)
    if _upload_files(job, claim, provider) == "failed":
        return "failed"
    if not job.remote_job_id and _create_remote_job(job, claim, provider) == "canceled":
        return "canceled"
    if job.submitted_at is None and not _start(job, claim, provider):
        return "busy"
    job.refresh_from_db()
    if job.cancel_requested:
        training_job_cancel_remote(job_id=job.id)
    return "submitted"


def _upload_files(job: TrainingJob, claim: Claim, provider: Provider) -> JobOutcome | None:
    """Build and upload the files not uploaded yet; "failed" when the data is refused."""
    if not provider_kind(job.provider).uploads_files:
        _note_export(job, claim)
        return None
    source = validation_source(
        version=job.dataset_version, validation_version=job.validation_version
    )
    # A job created remotely without one (before versions' splits were sent) stays so.
    wants_validation = source is not None and not job.remote_job_id
    if job.remote_training_file_id and (not wants_validation or job.remote_validation_file_id):
        return None

    def heartbeat() -> None:
        claim.renew(raise_lost=True)

    directory = Path(tempfile.mkdtemp(prefix=f"studio-training-{job.id}-"))
    try:
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
            _fail(job, "The data was refused before upload:\n" + "\n".join(exc.lines), claim)
            return "failed"
        if not job.remote_training_file_id:
            _upload_training(job, claim, provider, training)
        if validation is not None and not job.remote_validation_file_id:
            assert source is not None
            _upload_validation(job, claim, provider, validation, source)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return None


def _note_export(job: TrainingJob, claim: Claim) -> None:
    """A provider that trains on the version's Hugging Face export as stored: what it is
    recorded as the job's training file, once."""
    version = job.dataset_version
    if job.training_file_sha256:
        return
    if version is None:
        if not job.events.filter(type="studio.dataset").exists():
            _note(job, "dataset", "No dataset: a GRPO job trains on the episodes it plays")
        return
    claim.renew(
        training_file_sha256=version.hf_sha256,
        training_file_bytes=version.hf_bytes,
        training_file_rows=version.rows,
    )
    job.training_file_sha256 = version.hf_sha256
    _note(
        job,
        "dataset",
        f"Training on the Hugging Face export of version {version.id}: {version.rows} rows "
        f"(sha256 {version.hf_sha256})",
    )


def _upload(
    job: TrainingJob, claim: Claim, provider: Provider, file: UploadFile, *, role: str
) -> str:
    """Upload the `role` ("training" or "validation") file; its id is written the moment it
    is known, so a second delivery never uploads it again."""
    file_id = provider.upload(file=file, idempotency_key=f"{job.idempotency_key}-{role[0]}")
    claim.renew(
        **{
            f"remote_{role}_file_id": file_id,
            f"{role}_file_sha256": file.sha256,
            f"{role}_file_bytes": file.bytes,
            f"{role}_file_rows": file.rows,
        },
    )
    setattr(job, f"remote_{role}_file_id", file_id)
    return file_id


def _upload_training(job: TrainingJob, claim: Claim, provider: Provider, file: UploadFile) -> None:
    _note(job, "upload", f"Uploading {file.rows} rows ({file.bytes} bytes)")
    file_id = _upload(job, claim, provider, file, role="training")
    _note(job, "uploaded", f"Training file {file_id} (sha256 {file.sha256})")


def _upload_validation(
    job: TrainingJob, claim: Claim, provider: Provider, file: UploadFile, source: ValidationSource
) -> None:
    file_id = _upload(job, claim, provider, file, role="validation")
    origin = (
        f"the validation split of version {source.version.id}"
        if source.is_split
        else f"validation version {source.version.id}"
    )
    _note(
        job,
        "uploaded",
        f"Validation file {file_id}: {file.rows} rows from {origin} (sha256 {file.sha256})",
    )


def _create_remote_job(job: TrainingJob, claim: Claim, provider: Provider) -> JobOutcome | None:
    """Create the remote job once, even across a worker that died mid-way; "canceled" when a
    cancel was asked for before it existed."""
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
        claim.renew(create_attempts=job.create_attempts + 1)
        remote_id = provider.create_job(spec=spec, idempotency_key=job.idempotency_key)
    claim.renew(remote_job_id=remote_id)
    job.remote_job_id = remote_id
    _note(job, "created_remote", f"Remote job {remote_id} created")
    return None


def _start(job: TrainingJob, claim: Claim, provider: Provider) -> bool:
    """Start the remote job and end the claim as submitted; False: the claim was lost."""
    provider.start_job(remote_job_id=job.remote_job_id)
    if not claim.finish(submitted_at=timezone.now(), claim_token=""):
        return False
    _note(job, "started", "Job started")
    return True


def _sections(effective: dict) -> dict[str, dict]:
    return {name: dict(values) for name, values in (effective or {}).items()}
