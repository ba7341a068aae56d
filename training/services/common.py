"""What every training service shares: the submission value, keys, notes, failures."""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from django.utils import timezone

from curation.models import DatasetVersion
from studio.claims import Claim
from studio.endpoints import endpoint_api_key, endpoint_get, endpoint_read_since
from studio.jobs import error_cut
from studio.models import Endpoint
from training.config import TrainingConfig
from training.models import TrainingEvent, TrainingJob
from training.providers import (
    Provider,
    ProviderError,
    provider_for,
    provider_kind,
    provider_kinds,
)
from training.providers.base import JobSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Submission:
    """Everything a job is created from, checked: what the CLI and the form both build.
    `version` is None for a GRPO job: it trains on the episodes it plays."""

    version: DatasetVersion | None
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
            training_file_id=training_file_id or ("{training_file_id}" if self.version else ""),
            validation_file_id=validation_file_id
            or ("{validation_file_id}" if self.validation_version else ""),
            metadata=job_metadata(job_id="{job_id}", idempotency_key="{idempotency_key}"),
        )


def job_metadata(*, job_id: str, idempotency_key: str) -> dict[str, str]:
    """Sent with the remote job: which studio job it is, and the key to find it again."""
    return {"studio_job": job_id, "studio_submission": idempotency_key}


class SubmissionError(ValueError):
    """A submission that cannot be made; `lines` are its one-line errors."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        super().__init__("\n".join(lines))


# -- where a job's requests go, and with which key ----------------------------------------


def endpoint_target(*, name: str, provider: str) -> tuple[str, str]:
    """(base URL, key variable) of an admin-named endpoint of this provider's kind."""
    endpoint = endpoint_get(name=name, kind=provider_kind(provider).endpoint_kind)
    return endpoint.base_url, endpoint.api_key_env


def _api_key(job: TrainingJob) -> str:
    """The key for this job's base URL, from the environment; "" when none is configured.

    A browser job names its endpoint: the key is that endpoint's, and only while the endpoint
    still points where the job does (an admin who moves it does not send the key elsewhere).
    """
    if job.endpoint_name:
        kind = provider_kind(job.provider).endpoint_kind
        endpoint = Endpoint.objects.filter(name=job.endpoint_name, kind=kind).first()
        return endpoint_api_key(_endpoint_still_usable(job, endpoint))
    # The CLI's job names a variable: only a provider's own key variable is read.
    if job.api_key_env not in {kind.key_env for kind in provider_kinds()}:
        return ""
    return os.environ.get(job.api_key_env, "")


def _endpoint_still_usable(job: TrainingJob, endpoint: Endpoint | None) -> Endpoint:
    """The job's endpoint; `EndpointStopped` when it may no longer get its key."""
    if (
        endpoint is None
        or endpoint.kind != provider_kind(job.provider).endpoint_kind
        or endpoint.base_url.rstrip("/") != job.base_url.rstrip("/")
    ):
        raise EndpointStopped(
            f"endpoint {job.endpoint_name!r} is gone or now points elsewhere; "
            "its key is not sent to the job's old URL"
        )
    if not endpoint.enabled:
        raise EndpointStopped(
            f"endpoint {job.endpoint_name!r} was disabled by an admin; nothing is sent "
            "with its key, so the studio stopped following this job"
        )
    return endpoint


class EndpointStopped(ProviderError):
    """The job's endpoint may no longer be used: nothing more is sent for this job."""


def _key_watch(job: TrainingJob, api_key: str) -> Callable[[], None] | None:
    """What a provider calls before each request of a job that holds an endpoint's key: the
    endpoint is read again (after the previous request, within a second or so), so a poll,
    an upload's retries or a submission's steps stop at once when an admin disables it."""
    if not job.endpoint_name:
        return None
    sent_at = time.monotonic()

    def before_request() -> None:
        nonlocal sent_at
        endpoint = endpoint_read_since(name=job.endpoint_name, since=sent_at)
        if endpoint_api_key(_endpoint_still_usable(job, endpoint)) != api_key:
            # The job goes on with the new key from its next call; this one is not sent.
            raise ProviderError(
                f"endpoint {job.endpoint_name!r} was given another key by an admin",
                retryable=True,
            )
        sent_at = time.monotonic()

    return before_request


def _provider(job: TrainingJob, *, max_retries: int | None = None) -> Provider:
    api_key = _api_key(job)
    return provider_for(
        name=job.provider,
        base_url=job.base_url,
        api_key=api_key,
        max_retries=max_retries,
        before_request=_key_watch(job, api_key),
    )


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


def _fail(job: TrainingJob, error: str, claim: Claim | None = None) -> None:
    """Fail the job: through the submission's `claim`, else (a poll) as it is."""
    logger.warning("training job %s failed: %s", job.id, error.splitlines()[0][:200])
    if claim is not None:
        claim.fail(error, claim_token="")
    else:
        TrainingJob.objects.filter(id=job.id).update(
            status=TrainingJob.Status.FAILED,
            error=error_cut(error),
            claim_token="",
            finished_at=timezone.now(),
        )
    _note(job, "failed", error.splitlines()[0][:500], level=TrainingEvent.Level.ERROR)


def _finish(job: TrainingJob, *, status: str, error: str) -> None:
    TrainingJob.objects.filter(id=job.id).exclude(status__in=TrainingJob.TERMINAL).update(
        status=status, error=error_cut(error), claim_token="", finished_at=timezone.now()
    )
