"""The `openai` provider: OpenAI, Azure OpenAI or any compatible server, via the `openai` package.

`files.create` streams the file, `fine_tuning.jobs.create` uses the supervised method with
hyperparameters mapped from the TOML (only the keys OpenAI has; the others are listed in the
dry run as not sent), then `retrieve`, `list_events` and `cancel`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import Callable, Iterator
from typing import Any

import openai
from django.conf import settings

from training.config import Key
from training.providers.base import (
    MAX_EVENT_PAGES_PER_POLL,
    MAX_EVENTS_PER_POLL,
    JobSpec,
    PlannedRequest,
    ProviderError,
    RemoteEvent,
    RemoteState,
    UploadFile,
    clean_data,
    clean_number,
    clean_step,
    clean_text,
    model_id,
    remote_id,
    remote_status,
)
from training.providers.http import call_seconds, provider_http_client, upload_seconds
from training.providers.kinds import ProviderKind, register

DEFAULT_BASE_URL = "https://api.openai.com/v1"
STATUS_MAP = {
    "validating_files": "submitted",
    "queued": "submitted",
    "running": "running",
    "succeeded": "succeeded",
    "failed": "failed",
    "cancelled": "canceled",
    "canceled": "canceled",
}
# TOML keys that have no counterpart in OpenAI's supervised fine-tuning.
NOT_SENT = {
    "job": ("modalities", "description"),
    "compute": ("gpu_type", "gpu_count", "nodes"),
    "training": ("use_qlora",),
    "data": ("topology",),
    "hyperparameters": (
        "train_kind",
        "sequence_length",
        "learning_rate",
        "warmup_ratio",
        "weight_decay",
    ),
}


def openai_model(model: str) -> str:
    """synth-ai writes `openai/gpt-4o-mini-...`; OpenAI's own id has no provider prefix."""
    return model.removeprefix("openai/")


def create_params(spec: JobSpec) -> dict[str, Any]:
    """The keyword arguments of `fine_tuning.jobs.create`, which are also its JSON body."""
    config = spec.config
    hp = config.sections.get("hyperparameters", {})
    hyperparameters: dict[str, Any] = {"n_epochs": int(hp["n_epochs"])}
    if "batch_size" in hp:
        hyperparameters["batch_size"] = int(hp["batch_size"])
    elif "per_device_batch" in hp or "gradient_accumulation_steps" in hp:
        # The reference's global batch: per device x accumulation x GPUs x nodes.
        compute = config.sections.get("compute", {})
        hyperparameters["batch_size"] = (
            int(hp.get("per_device_batch", 1))
            * int(hp.get("gradient_accumulation_steps", 1))
            * int(compute.get("gpu_count", 1))
            * int(compute.get("nodes", 1))
        )
    if "learning_rate_multiplier" in hp:
        hyperparameters["learning_rate_multiplier"] = float(hp["learning_rate_multiplier"])
    params: dict[str, Any] = {
        "model": openai_model(spec.model),
        "training_file": spec.training_file_id,
        "method": {"type": "supervised", "supervised": {"hyperparameters": hyperparameters}},
    }
    if spec.validation_file_id:
        params["validation_file"] = spec.validation_file_id
    if config.get("job", "suffix"):
        params["suffix"] = config.get("job", "suffix")
    if config.get("job", "seed") is not None:
        params["seed"] = int(config.get("job", "seed"))
    if spec.metadata:
        params["metadata"] = dict(spec.metadata)
    return params


def not_sent(spec: JobSpec) -> list[str]:
    present = []
    for section, keys in NOT_SENT.items():
        for key in keys:
            if key in spec.config.sections.get(section, {}):
                present.append(f"[{section}] {key}")
    for section in ("training.validation", "hyperparameters.parallelism"):
        if section in spec.config.sections:
            present.append(f"[{section}]")
    return present


def _error(exc: Exception, what: str) -> ProviderError:
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        if 300 <= status < 400:
            where = clean_text(exc.response.headers.get("location", ""), limit=100)
            return ProviderError(
                f"openai: {what} answered {status}, a redirect to {where!r}: not followed "
                "(a key and a training file go only to the endpoint's URL)",
                status=status,
            )
        message = clean_text(getattr(exc, "message", "") or str(exc), limit=300)
        return ProviderError(
            f"openai: {what} answered {status}: {message}",
            retryable=status == 429 or status >= 500,
            status=status,
        )
    if isinstance(exc, openai.APITimeoutError):
        return ProviderError(f"openai: {what} took longer than its deadline", retryable=True)
    if isinstance(exc, openai.APIConnectionError):
        return ProviderError(f"openai: {what} failed: {clean_text(exc, limit=200)}", retryable=True)
    if isinstance(exc, openai.OpenAIError):
        return ProviderError(f"openai: {what} failed: {clean_text(exc, limit=300)}")
    # Whatever the client library raised on an answer it could not read (JSON nested
    # 100,000 deep, fields of the wrong type): nonsense from the provider, one line.
    return ProviderError(
        f"openai: {what} answered something unreadable ({type(exc).__name__}: "
        f"{clean_text(exc, limit=150)})"
    )


@contextlib.contextmanager
def _calling(what: str) -> Iterator[None]:
    try:
        yield
    except ProviderError:
        raise
    except Exception as exc:
        raise _error(exc, what) from exc


class OpenAIProvider:
    name = "openai"

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        max_retries: int | None = None,
        before_request: Callable[[], None] | None = None,
    ) -> None:
        self.base_url = (base_url or DEFAULT_BASE_URL).rstrip("/")
        retries = settings.STUDIO_TRAINING_MAX_RETRIES if max_retries is None else max_retries
        self._client = openai.OpenAI(
            # Local compatible servers take any key; the client insists on one.
            api_key=api_key or "not-needed",
            base_url=self.base_url,
            max_retries=retries,
            timeout=call_seconds(),
            # No redirect is followed; each request's timeout bounds all of it.
            http_client=provider_http_client(
                client_class=openai.DefaultHttpxClient, before_request=before_request
            ),
        )

    def plan(
        self, *, spec: JobSpec, training: UploadFile | None, validation: UploadFile | None
    ) -> list[PlannedRequest]:
        plans = []
        for file in (training, validation):
            if file is None:
                continue
            plans.append(
                PlannedRequest(
                    "POST",
                    f"{self.base_url}/files",
                    {
                        "purpose": "fine-tune",
                        "file": file.describe(),
                    },
                    note=f"files.create, multipart/form-data, {file.rows} rows in --format openai",
                )
            )
        skipped = not_sent(spec)
        skipped_note = f"; not sent (OpenAI has no such setting): {', '.join(skipped)}"
        plans.append(
            PlannedRequest(
                "POST",
                f"{self.base_url}/fine_tuning/jobs",
                create_params(spec),
                note="fine_tuning.jobs.create" + (skipped_note if skipped else ""),
            )
        )
        return plans

    def upload(self, *, file: UploadFile, idempotency_key: str) -> str:
        with _calling("files.create"), file.open() as fh:
            # A file object is streamed by the client (and rewound on a retry).
            answer = self._client.files.create(
                file=(file.name, fh, "application/jsonl"),
                purpose="fine-tune",
                extra_headers={"Idempotency-Key": idempotency_key},
                timeout=upload_seconds(file.bytes),
            )
            return remote_id(answer.id, "openai: files.create")

    def create_job(self, *, spec: JobSpec, idempotency_key: str) -> str:
        with _calling("fine_tuning.jobs.create"):
            job = self._client.fine_tuning.jobs.create(
                **create_params(spec), extra_headers={"Idempotency-Key": idempotency_key}
            )
            return remote_id(job.id, "openai: fine_tuning.jobs.create")

    def find_job(self, *, idempotency_key: str) -> str:
        """A job this submission already created (its metadata carries the key), or ""."""
        with _calling("fine_tuning.jobs.list"):
            page = self._client.fine_tuning.jobs.list(
                limit=100, metadata={"studio_submission": idempotency_key}
            )
            for job in page.data:
                if (job.metadata or {}).get("studio_submission") == idempotency_key:
                    return remote_id(job.id, "openai: fine_tuning.jobs.list")
        return ""

    def start_job(self, *, remote_job_id: str) -> None:
        return None  # OpenAI starts a job when it is created

    def state(self, *, remote_job_id: str) -> RemoteState:
        with _calling("fine_tuning.jobs.retrieve"):
            job = self._client.fine_tuning.jobs.retrieve(remote_id(remote_job_id, "the job"))
            return _state(job)

    def events(self, *, remote_job_id: str, cursor: str) -> tuple[list[RemoteEvent], str]:
        """Events not yet read, oldest first, at most a poll's worth (`MAX_EVENTS_PER_POLL`
        events, `MAX_EVENT_PAGES_PER_POLL` requests: a provider that always says there is
        more, a page at a time, is read a few pages a poll).

        OpenAI lists events newest first (`after` pages towards older ones), so a backlog
        longer than one poll takes is read from the top down over several polls: the cursor
        holds the newest event stored before the backlog (`seen`) and the newest and oldest
        of the backlog read so far (`top`, `bottom`).
        """
        seen, top, bottom = _event_cursor(cursor)
        found: list[RemoteEvent] = []
        ended = False
        with _calling("fine_tuning.jobs.list_events"):
            job_id = remote_id(remote_job_id, "the job")
            options = {"after": bottom} if bottom else {}
            page = self._client.fine_tuning.jobs.list_events(job_id, limit=100, **options)
            pages = 1
            while len(found) < MAX_EVENTS_PER_POLL:
                for event in page.data[: MAX_EVENTS_PER_POLL - len(found)]:
                    if event.id == seen:
                        ended = True
                        break
                    found.append(_event(event))
                if ended or not page.has_next_page():
                    ended = True
                    break
                if pages >= MAX_EVENT_PAGES_PER_POLL:
                    break
                page = page.get_next_page()
                pages += 1
        if ended:  # everything down to `seen` is stored
            newest = top or (found[0].remote_id if found else seen)
            next_cursor = newest
        elif bottom:  # further down the backlog
            next_cursor = json.dumps({"seen": seen, "top": top, "bottom": found[-1].remote_id})
        else:  # a backlog begins
            next_cursor = json.dumps(
                {"seen": seen, "top": found[0].remote_id, "bottom": found[-1].remote_id}
            )
        found.reverse()
        return found, next_cursor

    def metrics(self, *, remote_job_id: str, after_step: int) -> tuple[list[RemoteEvent], int]:
        return [], after_step  # OpenAI reports its metrics as events of type "metrics"

    def cancel(self, *, remote_job_id: str) -> None:
        with _calling("fine_tuning.jobs.cancel"):
            self._client.fine_tuning.jobs.cancel(remote_id(remote_job_id, "the job"))


def _event_cursor(cursor: str) -> tuple[str, str, str]:
    """(seen, top, bottom) from a stored cursor: an event id, or JSON during a backlog."""
    if not cursor.startswith("{"):
        return cursor, "", ""
    try:
        parts = json.loads(cursor)
        return str(parts["seen"]), str(parts["top"]), str(parts["bottom"])
    except (ValueError, KeyError, TypeError):
        return "", "", ""


def _state(job: Any) -> RemoteState:
    status, remote = remote_status(job.status, STATUS_MAP, "openai: fine_tuning.jobs.retrieve")
    error = ""
    if job.error is not None and (job.error.message or job.error.code):
        error = clean_text(
            f"{job.error.code or 'error'}: {job.error.message or ''}"
            + (f" (param {job.error.param})" if job.error.param else "")
        )
    tokens = job.trained_tokens if isinstance(job.trained_tokens, int) else None
    if tokens is not None and not 0 <= tokens < 2**53:
        tokens = None
    return RemoteState(
        status=status,
        remote_status=remote,
        fine_tuned_model=model_id(job.fine_tuned_model, "openai: fine_tuning.jobs.retrieve"),
        trained_tokens=tokens,
        error=error,
    )


def _event(event: Any) -> RemoteEvent:
    data = event.data if isinstance(getattr(event, "data", None), dict) else {}
    data = clean_data(data) or {}
    level = clean_text(event.level, limit=20).lower()
    if level == "warn":
        level = "warning"
    if level not in ("info", "warning", "error"):
        level = "info"
    created = event.created_at if isinstance(event.created_at, int) else 0
    created = created if 0 < created < 2**33 else 0  # a date Python can hold
    return RemoteEvent(
        remote_id=clean_text(event.id, limit=200),
        time=dt.datetime.fromtimestamp(created, tz=dt.UTC) if created else dt.datetime.now(dt.UTC),
        level=level,
        type=clean_text(getattr(event, "type", "") or "", limit=100),
        message=clean_text(event.message),
        step=clean_step(data.get("step")),
        train_loss=clean_number(data.get("train_loss")),
        validation_loss=clean_number(data.get("valid_loss", data.get("full_valid_loss"))),
        data=data,
    )


OPENAI = register(
    ProviderKind(
        name="openai",
        client=OpenAIProvider,
        key_env="OPENAI_API_KEY",
        default_url=lambda: settings.OPENAI_BASE_URL or DEFAULT_BASE_URL,
        url_setting="OPENAI_BASE_URL",
        row_format="openai",
        endpoint_kind="openai",
        endpoint_label="Training: OpenAI-compatible fine-tuning",
        config_keys={
            "job": {
                "suffix": Key(
                    "str", max_length=64, help="openai: appended to the fine-tuned model id"
                ),
                "seed": Key("int", min=0, max=2**31 - 1, help="openai: the training seed"),
            },
            "hyperparameters": {
                "learning_rate_multiplier": Key("float", min=0.0, max=100.0, help="openai only"),
            },
        },
    )
)
