"""The `trl` provider: an open model trained with TRL on the studio's own machines.

Its "remote" is a row of ours (`training.models.LocalRun`) worked on by a Celery worker that
consumes the `train` queue (`celery -A studio worker -Q train`, on a machine with the
`.[train]` extra); submission, polling and cancel take the same path as any provider's. Nothing
is uploaded: the run trains on the version's Hugging Face export as stored. No URL, no key.

It is registered by the training app once its models are loaded (`training.apps`), not by
`training.providers`' own list: its client reads and writes those models.
"""

from __future__ import annotations

from typing import Any

from training.config import config_is_grpo
from training.local_runs import (
    local_run_cancel,
    local_run_create,
    local_run_events,
    local_run_metrics,
    local_run_start,
    local_run_state,
)
from training.open_models.arguments import TRL_CONFIG_KEYS, config_refusals
from training.providers.base import (
    JobSpec,
    PlannedRequest,
    ProviderError,
    RemoteEvent,
    RemoteState,
    UploadFile,
)
from training.providers.kinds import ProviderKind, register

# What `--base-url` and the job row say of where a trl job goes.
TRAIN_QUEUE_URL = "queue:train"
NOTICE = (
    "trl jobs train on the studio's own machines: a Celery worker started with "
    "`celery -A studio worker -Q train` on a machine with the `.[train]` extra installed "
    "(torch, transformers, trl, peft) takes them. Until one does, the job waits."
)


class TrlProvider:
    name = "trl"

    def __init__(self, *, base_url: str = TRAIN_QUEUE_URL, **_: Any) -> None:
        # No key and no URL: retries and the endpoint's watch have nothing to guard.
        self.base_url = base_url or TRAIN_QUEUE_URL

    def plan(
        self, *, spec: JobSpec, training: UploadFile | None, validation: UploadFile | None
    ) -> list[PlannedRequest]:
        grpo = config_is_grpo(spec.config.sections)
        body = {
            "base_model": spec.model,
            "training": (
                "the episodes it plays (GRPO)"
                if grpo
                else "the dataset version's Hugging Face export"
            ),
            "validation": "validation rows" if spec.validation_file_id else "none",
            "config": {name: dict(values) for name, values in spec.config.sections.items()},
        }
        note = "a local run, sent to the train queue; nothing is uploaded"
        return [PlannedRequest("QUEUE", TRAIN_QUEUE_URL, body, note=note)]

    def upload(self, *, file: UploadFile, idempotency_key: str) -> str:
        raise ProviderError("trl: nothing is uploaded (a run reads the Hugging Face export)")

    def create_job(self, *, spec: JobSpec, idempotency_key: str) -> str:
        job = str(spec.metadata.get("studio_job", ""))
        if not job.isdigit():
            raise ProviderError("trl: a run is created for a saved job only")
        return local_run_create(job_id=int(job))

    def start_job(self, *, remote_job_id: str) -> None:
        local_run_start(remote_job_id=remote_job_id)

    def state(self, *, remote_job_id: str) -> RemoteState:
        return local_run_state(remote_job_id=remote_job_id)

    def events(self, *, remote_job_id: str, cursor: str) -> tuple[list[RemoteEvent], str]:
        return local_run_events(remote_job_id=remote_job_id, cursor=cursor)

    def metrics(self, *, remote_job_id: str, after_step: int) -> tuple[list[RemoteEvent], int]:
        # The cursor is the last point's number, not a step (`local_run_metrics`).
        return local_run_metrics(remote_job_id=remote_job_id, after=after_step)

    def cancel(self, *, remote_job_id: str) -> None:
        local_run_cancel(remote_job_id=remote_job_id)


TRL = register(
    ProviderKind(
        name="trl",
        client=TrlProvider,
        key_env="",
        default_url=lambda: TRAIN_QUEUE_URL,
        url_setting="",
        # The export's own rows (the Hugging Face export is made from the studio format).
        row_format="studio",
        endpoint_kind="",
        endpoint_label="",
        config_keys=TRL_CONFIG_KEYS,
        needs_url=False,
        uploads_files=False,
        refusals=config_refusals,
        notice=NOTICE,
    )
)
