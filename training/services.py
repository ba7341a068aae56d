"""Writes for training jobs: create, submit (idempotent), poll, cancel.

Submission is one task that is safe to run twice. It claims the job with a conditional
UPDATE and a token; every remote id is written the moment the provider returns it; a second
delivery (a retry, or a worker killed mid-way) finds those ids and carries on from there, so
it never uploads a file again nor creates a second remote job. Keys are read from the
worker's environment at the moment of the call, never stored or logged.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from datasets.models import DatasetVersion
from studio.endpoints import endpoint_api_key, endpoint_get
from studio.models import Endpoint
from training.config import TrainingConfig
from training.models import TrainingEvent, TrainingJob
from training.providers import Provider, ProviderError, provider_for
from training.providers.base import JobSpec, PlannedRequest, RemoteEvent, UploadFile
from training.providers.synth import terminal_event_status
from training.upload_files import DataRefused, upload_file_build

logger = logging.getLogger(__name__)

SubmitOutcome = Literal["submitted", "busy", "done_already", "failed", "retry", "canceled"]
# Where the CLI's key comes from, per provider (the browser uses the endpoint's variable).
KEY_ENV = {"synth": "SYNTH_API_KEY", "openai": "OPENAI_API_KEY"}
ERROR_CHARS = 20000


@dataclass(frozen=True)
class Submission:
    """Everything a job is created from, checked: what the CLI and the form both build."""

    version: DatasetVersion
    validation_version: DatasetVersion | None
    config: TrainingConfig
    config_text: str
    provider: str
    base_url: str
    api_key_env: str
    endpoint_name: str
    model: str

    def spec(self, *, training_file_id: str = "", validation_file_id: str = "") -> JobSpec:
        return JobSpec(
            config=self.config,
            model=self.model,
            training_file_id=training_file_id or "{training_file_id}",
            validation_file_id=validation_file_id
            or ("{validation_file_id}" if self.validation_version else ""),
        )


class SubmissionError(ValueError):
    """A submission that cannot be made; `lines` are its one-line errors."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        super().__init__("\n".join(lines))


# -- where a job's requests go, and with which key ----------------------------------------


def endpoint_target(*, name: str, provider: str) -> tuple[str, str]:
    """(base URL, key variable) of an admin-named endpoint of this provider's kind."""
    endpoint = endpoint_get(name=name, kind=provider)
    return endpoint.base_url, endpoint.api_key_env


def _api_key(job: TrainingJob) -> str:
    """The key for this job's base URL, from the environment; "" when none is configured.

    A browser job names its endpoint: the key is that endpoint's, and only while the endpoint
    still points where the job does (an admin who moves it does not send the key elsewhere).
    """
    if job.endpoint_name:
        endpoint = Endpoint.objects.filter(name=job.endpoint_name, kind=job.provider).first()
        if endpoint is None or endpoint.base_url.rstrip("/") != job.base_url.rstrip("/"):
            raise ProviderError(
                f"endpoint {job.endpoint_name!r} is gone or now points elsewhere; "
                "its key is not sent to the job's old URL"
            )
        return endpoint_api_key(endpoint)
    if job.api_key_env not in KEY_ENV.values():
        return ""
    return os.environ.get(job.api_key_env, "")


def _provider(job: TrainingJob) -> Provider:
    return provider_for(name=job.provider, base_url=job.base_url, api_key=_api_key(job))


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
    )
    _note(job, "created", f"Job saved; {submission.provider} at {submission.base_url}")
    if enqueue:
        transaction.on_commit(lambda: training_job_enqueue(job_id=job.id))
    return job


def training_job_enqueue(*, job_id: int) -> None:
    from training.tasks import training_job_submit as task

    task.delay(job_id)


def training_job_plan(*, submission: Submission, build_files: bool) -> list[PlannedRequest]:
    """The requests a submission would send, without sending anything (`--dry-run`).

    With `build_files`, the upload files are made and checked as for real, so the sizes and
    sha256 shown are those that would be uploaded (DataRefused when the data is refused).
    """
    provider = provider_for(name=submission.provider, base_url=submission.base_url, api_key="")
    spec = submission.spec()
    if not build_files:
        return provider.plan(spec=spec, training=None, validation=None)
    directory = Path(tempfile.mkdtemp(prefix="studio-dry-run-"))
    try:
        training, validation = _build_files(
            version=submission.version,
            validation_version=submission.validation_version,
            provider=submission.provider,
            directory=directory,
            label="dry-run",
        )
        return provider.plan(spec=spec, training=training, validation=validation)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _build_files(
    *,
    version: DatasetVersion,
    validation_version: DatasetVersion | None,
    provider: str,
    directory: Path,
    label: str,
) -> tuple[UploadFile, UploadFile | None]:
    problems: list[str] = []
    training = validation = None
    try:
        training = upload_file_build(
            version=version, provider=provider, role="train", directory=directory, label=label
        )
    except DataRefused as exc:
        problems += exc.lines
    if validation_version is not None:
        try:
            validation = upload_file_build(
                version=validation_version,
                provider=provider,
                role="val",
                directory=directory,
                label=label,
            )
        except DataRefused as exc:
            problems += exc.lines
    if problems:
        raise DataRefused(problems)
    assert training is not None
    return training, validation


# -- submit ---------------------------------------------------------------------------------


def _claim(*, job_id: int) -> str | None:
    now = timezone.now()
    stale = now - dt.timedelta(seconds=settings.STUDIO_TRAINING_STALE_SECONDS)
    token = uuid.uuid4().hex
    claimed = (
        TrainingJob.objects.filter(id=job_id, cancel_requested=False)
        .filter(
            Q(status=TrainingJob.Status.PENDING)
            | Q(status=TrainingJob.Status.UPLOADING, heartbeat_at__lt=stale)
        )
        .update(
            status=TrainingJob.Status.UPLOADING,
            claim_token=token,
            heartbeat_at=now,
            attempts=F("attempts") + 1,
        )
    )
    return token if claimed == 1 else None


def _save_mine(job_id: int, token: str, **fields) -> bool:
    """Write fields only while this worker still holds the claim."""
    fields.setdefault("heartbeat_at", timezone.now())
    return TrainingJob.objects.filter(id=job_id, claim_token=token).update(**fields) == 1


def training_job_submit(*, job_id: int) -> SubmitOutcome:
    """Upload, create and start the remote job. Safe to run twice: the row says what exists."""
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
    except ProviderError as exc:
        if exc.retryable:
            # Hand the claim back at once; the task tries again after a backoff.
            TrainingJob.objects.filter(id=job_id, claim_token=token).update(
                status=TrainingJob.Status.PENDING, claim_token="", error=str(exc)[:ERROR_CHARS]
            )
            _note(job, "retry", f"Will retry: {exc}", level=TrainingEvent.Level.WARNING)
            return "retry"
        _fail(job, str(exc), token=token)
        return "failed"


def _submit_claimed(job: TrainingJob, token: str) -> SubmitOutcome:
    provider = _provider(job)
    directory = Path(tempfile.mkdtemp(prefix=f"studio-training-{job.id}-"))
    try:
        if not job.remote_training_file_id or (
            job.validation_version_id and not job.remote_validation_file_id
        ):
            try:
                training, validation = _build_files(
                    version=job.dataset_version,
                    validation_version=job.validation_version,
                    provider=job.provider,
                    directory=directory,
                    label=f"studio-job-{job.id}",
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
                _note(job, "uploaded", f"Validation file {file_id} (sha256 {validation.sha256})")
    finally:
        shutil.rmtree(directory, ignore_errors=True)

    if not job.remote_job_id:
        spec = JobSpec(
            config=TrainingConfig(sections=_sections(job.effective_config)),
            model=job.model,
            training_file_id=job.remote_training_file_id,
            validation_file_id=job.remote_validation_file_id,
            metadata={"studio_job": str(job.id), "studio_submission": job.idempotency_key},
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


def _fail(job: TrainingJob, error: str, token: str | None = None) -> None:
    logger.warning("training job %s failed: %s", job.id, error.splitlines()[0][:200])
    query = TrainingJob.objects.filter(id=job.id)
    if token is not None:
        query = query.filter(claim_token=token)
    query.update(
        status=TrainingJob.Status.FAILED,
        error=error[:ERROR_CHARS],
        claim_token="",
        finished_at=timezone.now(),
    )
    _note(job, "failed", error.splitlines()[0][:500], level=TrainingEvent.Level.ERROR)


def _finish(job: TrainingJob, *, status: str, error: str) -> None:
    TrainingJob.objects.filter(id=job.id).exclude(status__in=TrainingJob.TERMINAL).update(
        status=status, error=error[:ERROR_CHARS], claim_token="", finished_at=timezone.now()
    )


# -- poll -----------------------------------------------------------------------------------


def training_job_poll(*, job_id: int) -> str:
    """Ask the provider once: new events and metrics are stored, the status follows."""
    job = TrainingJob.objects.filter(id=job_id).first()
    if job is None or not job.remote_job_id or job.status in TrainingJob.TERMINAL:
        return "skipped"
    if job.submitted_at is None:
        return "skipped"  # the submission task has not finished starting it
    provider = _provider(job)
    try:
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
            training_job_poll(job_id=job_id)
            polled += 1
    return polled


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
    from training.tasks import training_job_cancel as task

    transaction.on_commit(lambda: task.delay(job.id))


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


# -- notes ------------------------------------------------------------------------------------


def _note(job: TrainingJob, kind: str, message: str, *, level: str = "info") -> None:
    """An event the studio itself records, beside the provider's (its id cannot clash)."""
    TrainingEvent.objects.create(
        job_id=job.id,
        remote_id=f"studio:{uuid.uuid4().hex}",
        time=timezone.now(),
        level=level,
        type=f"studio.{kind}",
        message=message[:4000],
    )
