"""The `synth` provider: synth-ai 0.2.10's learning API (docs/training.md), over plain HTTP.

Requests as `run_fft_and_save.py` sends them, events and metrics as synth-ai's own
`JobHandle` reads them (`events?since_seq=N`, `metrics?after_step=N`). The file goes up as a
streamed multipart body (the version's file can be hundreds of MB; it is never read whole).
"""

from __future__ import annotations

import datetime as dt
import json
import random
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx2
from django.conf import settings

from training.providers.base import (
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
    points_per_poll,
    remote_id,
    remote_status,
)
from training.providers.http import (
    AnswerTooLarge,
    UnreadableAnswer,
    call_seconds,
    provider_http_client,
    upload_seconds,
)
from training.providers.kinds import ProviderKind, register

CHUNK = 1 << 20
# run_fft_and_save.py forwards these hyperparameters as they are; the studio adds
# weight_decay, which that script dropped without a word.
HYPERPARAMETER_KEYS = (
    "batch_size",
    "per_device_batch",
    "gradient_accumulation_steps",
    "sequence_length",
    "learning_rate",
    "warmup_ratio",
    "weight_decay",
    "train_kind",
)
SUCCESS_EVENTS = {"sft.completed", "sft.workflow.completed", "workflow.completed"}
FAILURE_EVENTS = {"sft.failed", "sft.workflow.failed", "workflow.failed"}
STATUS_MAP = {
    "queued": "submitted",
    "pending": "submitted",
    "created": "submitted",
    "validating_files": "submitted",
    "running": "running",
    "in_progress": "running",
    "training": "running",
    "succeeded": "succeeded",
    "completed": "succeeded",
    "failed": "failed",
    "error": "failed",
    "canceled": "canceled",
    "cancelled": "canceled",
}


def job_body(spec: JobSpec) -> dict[str, Any]:
    """`POST {base}/learning/jobs`: the TOML mapped as synth-ai's run_fft_and_save.py does."""
    config = spec.config
    hp = config.sections.get("hyperparameters", {})
    hyperparameters: dict[str, Any] = {"n_epochs": int(hp.get("n_epochs") or 1)}
    for key in HYPERPARAMETER_KEYS:
        if key in hp:
            hyperparameters[key] = hp[key]
    parallelism = config.sections.get("hyperparameters.parallelism")
    if parallelism:
        hyperparameters["parallelism"] = dict(parallelism)
    training = config.sections.get("training", {})
    effective: dict[str, Any] = {
        "compute": dict(config.sections.get("compute", {})),
        "data": {"topology": dict(config.get("data", "topology") or {})},
        "training": {k: v for k, v in training.items() if k in ("mode", "use_qlora")},
    }
    validation = config.sections.get("training.validation")
    if validation is not None:
        # The backend maps metric_for_best_model 'val.loss' to its own eval_loss.
        hyperparameters.update(
            {
                "evaluation_strategy": validation.get("evaluation_strategy", "steps"),
                "eval_steps": int(validation.get("eval_steps", 0) or 0),
                "save_best_model_at_end": bool(validation.get("save_best_model_at_end", True)),
                "metric_for_best_model": validation.get("metric_for_best_model", "val.loss"),
                "greater_is_better": bool(validation.get("greater_is_better", False)),
            }
        )
        effective["training"]["validation"] = {"enabled": bool(validation.get("enabled", True))}
    if spec.validation_file_id:
        effective["data"]["validation_files"] = [spec.validation_file_id]
    metadata: dict[str, Any] = {"effective_config": effective, **spec.metadata}
    if config.get("job", "description"):
        metadata["description"] = config.get("job", "description")
    return {
        "model": spec.model,
        "training_file_id": spec.training_file_id,
        "training_type": training.get("mode", "sft_offline"),
        "hyperparameters": hyperparameters,
        "metadata": metadata,
    }


class SynthProvider:
    name = "synth"

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        max_retries: int | None = None,
        before_request: Callable[[], None] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self.max_retries = (
            settings.STUDIO_TRAINING_MAX_RETRIES if max_retries is None else max_retries
        )
        self._http = provider_http_client(before_request=before_request)

    # -- requests ------------------------------------------------------------------------

    def _url(self, path: str) -> str:
        return f"{self.base_url}/{path.lstrip('/')}"

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json", **(extra or {})}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        headers: dict[str, str] | None = None,
        stream: Any = None,
        length: int | None = None,
        seconds: float | None = None,
    ) -> Any:
        """One request with retries for 429, 5xx and network errors; JSON back.

        Never follows a redirect (the key stays with the endpoint's URL), and `seconds`
        (default: the call deadline) bounds the whole exchange, not each read.
        """
        attempt = 0
        while True:
            if stream is not None:
                data: Any = stream()
            elif body is not None:
                data = json.dumps(body).encode("utf-8")
            else:
                data = None
            hdrs = self._headers(headers)
            if body is not None and stream is None:
                hdrs["Content-Type"] = "application/json"
            if length is not None:
                hdrs["Content-Length"] = str(length)
            answer, error = self._attempt(method, path, data, hdrs, seconds or call_seconds())
            if error is None:
                return answer
            if not error.retryable or attempt >= self.max_retries:
                raise error
            attempt += 1
            delay = min(
                settings.STUDIO_OPENAI_BACKOFF_MAX,
                settings.STUDIO_OPENAI_BACKOFF_BASE * 2 ** (attempt - 1),
            )
            time.sleep(delay * (0.5 + random.random() / 2))

    def _attempt(
        self, method: str, path: str, data: Any, headers: dict[str, str], seconds: float
    ) -> tuple[Any, ProviderError | None]:
        """Send once: the JSON answer, or the error to raise or retry."""
        what = f"synth: {method} {path}"
        try:
            response = self._http.request(
                method, self._url(path), content=data, headers=headers, timeout=seconds
            )
        except httpx2.TimeoutException:
            return None, ProviderError(f"{what} took longer than {seconds:g} s", retryable=True)
        except (AnswerTooLarge, UnreadableAnswer) as exc:
            return None, ProviderError(f"{what}: {clean_text(exc, limit=200)}")
        except (httpx2.HTTPError, OSError) as exc:
            error = ProviderError(f"{what} failed: {clean_text(exc, limit=200)}", retryable=True)
            return None, error
        status = response.status_code
        if 300 <= status < 400:
            where = clean_text(response.headers.get("location", ""), limit=100)
            return None, ProviderError(
                f"{what} answered {status}, a redirect to {where!r}: not followed "
                "(a key goes only to its endpoint's URL)",
                status=status,
            )
        if status >= 400:
            detail = clean_text(response.content[:2000].decode("utf-8", "replace"), limit=300)
            return None, ProviderError(
                f"{what} answered {status}: {detail}",
                retryable=status == 429 or status >= 500,
                status=status,
            )
        try:
            return (json.loads(response.content) if response.content.strip() else {}), None
        except (ValueError, RecursionError) as exc:
            # Not JSON, or JSON nested past what the parser takes (a 100,000-deep answer).
            error = ProviderError(f"{what} answered unreadable JSON: {clean_text(exc, limit=100)}")
            return None, error

    # -- the protocol --------------------------------------------------------------------

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
                    self._url("learning/files"),
                    {
                        "purpose": "fine-tune",
                        "file": file.describe(),
                    },
                    note=f"multipart/form-data, {file.rows} rows in --format synth",
                )
            )
        skipped = [f"[job] {key}" for key in ("modalities",) if spec.config.get("job", key)]
        note = (
            f"not sent (run_fft_and_save.py has no field): {', '.join(skipped)}" if skipped else ""
        )
        plans.append(PlannedRequest("POST", self._url("learning/jobs"), job_body(spec), note=note))
        plans.append(PlannedRequest("POST", self._url("learning/jobs/{id}/start"), {}))
        return plans

    def upload(self, *, file: UploadFile, idempotency_key: str) -> str:
        boundary = uuid.uuid4().hex
        head = (
            f"--{boundary}\r\n"
            'Content-Disposition: form-data; name="purpose"\r\n\r\n'
            "fine-tune\r\n"
            f"--{boundary}\r\n"
            f'Content-Disposition: form-data; name="file"; filename="{file.name}"\r\n'
            "Content-Type: application/jsonl\r\n\r\n"
        ).encode()
        tail = f"\r\n--{boundary}--\r\n".encode()

        def body() -> Iterator[bytes]:
            yield head
            with file.open() as fh:
                while chunk := fh.read(CHUNK):
                    yield chunk
            yield tail

        answer = self._call(
            "POST",
            "learning/files",
            stream=body,
            length=len(head) + file.bytes + len(tail),
            seconds=upload_seconds(file.bytes),
            headers={
                "Content-Type": f"multipart/form-data; boundary={boundary}",
                "Idempotency-Key": idempotency_key,
            },
        )
        return remote_id(answer.get("id") if isinstance(answer, dict) else None, "synth: upload")

    def create_job(self, *, spec: JobSpec, idempotency_key: str) -> str:
        answer = self._call(
            "POST",
            "learning/jobs",
            body=job_body(spec),
            headers={"Idempotency-Key": idempotency_key},
        )
        job_id = (answer.get("job_id") or answer.get("id")) if isinstance(answer, dict) else None
        return remote_id(job_id, "synth: create job")

    def start_job(self, *, remote_job_id: str) -> None:
        self._call("POST", f"learning/jobs/{_q(remote_job_id)}/start", body={})

    def state(self, *, remote_job_id: str) -> RemoteState:
        answer = self._call("GET", f"learning/jobs/{_q(remote_job_id)}")
        answer = answer if isinstance(answer, dict) else {}
        status, remote = remote_status(answer.get("status"), STATUS_MAP, "synth: job status")
        error = answer.get("error")
        if isinstance(error, dict):
            error = error.get("message") or json.dumps(clean_data(error))[:2000]
        tokens = answer.get("trained_tokens")
        return RemoteState(
            status=status,
            remote_status=remote,
            fine_tuned_model=model_id(answer.get("fine_tuned_model"), "synth: job status"),
            trained_tokens=tokens
            if isinstance(tokens, int) and not isinstance(tokens, bool) and 0 <= tokens < 2**53
            else None,
            error=clean_text(error),
        )

    def events(self, *, remote_job_id: str, cursor: str) -> tuple[list[RemoteEvent], str]:
        since = int(cursor) if cursor.isdigit() else 0
        answer = self._call(
            "GET", f"learning/jobs/{_q(remote_job_id)}/events?since_seq={since}&limit=200"
        )
        raw = answer.get("events") if isinstance(answer, dict) else None
        numbered = []
        for item in raw if isinstance(raw, list) else []:
            seq = clean_step(item.get("seq")) if isinstance(item, dict) else None
            if seq is not None and seq > since:
                numbered.append((seq, item))
        # At most a poll's worth, oldest first: the cursor stops at the last one taken, so
        # the rest come with the next poll.
        numbered.sort(key=lambda pair: pair[0])
        events = []
        for seq, item in numbered[:MAX_EVENTS_PER_POLL]:
            kind = clean_text(item.get("type"), limit=100)
            data = clean_data(item.get("data")) if isinstance(item.get("data"), dict) else {}
            level = clean_text(item.get("level"), limit=20).lower()
            if level not in ("info", "warning", "error"):
                level = "error" if kind in FAILURE_EVENTS else "info"
            events.append(
                RemoteEvent(
                    remote_id=f"seq:{seq}",
                    time=_time(item.get("created_at")),
                    level=level,
                    type=kind,
                    message=clean_text(item.get("message")),
                    step=clean_step(data.get("step")),
                    train_loss=clean_number(data.get("train_loss", data.get("loss"))),
                    validation_loss=clean_number(data.get("val_loss", data.get("eval_loss"))),
                    data=data,
                )
            )
            since = max(since, seq)
        return events, str(since)

    def metrics(self, *, remote_job_id: str, after_step: int) -> tuple[list[RemoteEvent], int]:
        answer = self._call(
            "GET", f"learning/jobs/{_q(remote_job_id)}/metrics?after_step={after_step}&limit=500"
        )
        raw = answer.get("points") if isinstance(answer, dict) else None
        usable = []
        for item in raw if isinstance(raw, list) else []:
            if not isinstance(item, dict):
                continue
            step = clean_step(item.get("step"))
            value = clean_number(item.get("value"))
            name = clean_text(item.get("name"), limit=60)
            if step is not None and value is not None and name and step > after_step:
                usable.append((step, name, value, item))
        points = []
        newest = after_step
        for step, name, value, item in points_per_poll(usable):
            validation = "val" in name or "eval" in name
            points.append(
                RemoteEvent(
                    remote_id=f"metric:{name}:{step}",
                    time=_time(item.get("created_at")),
                    type="metric",
                    message=f"{name} = {value:.6g} at step {step}",
                    step=step,
                    train_loss=None if validation else value,
                    validation_loss=value if validation else None,
                    data={"name": name, "value": value},
                )
            )
            newest = max(newest, step)
        return points, newest

    def cancel(self, *, remote_job_id: str) -> None:
        self._call("POST", f"learning/jobs/{_q(remote_job_id)}/cancel", body={})


def terminal_event_status(event: RemoteEvent) -> str | None:
    if event.type in SUCCESS_EVENTS:
        return "succeeded"
    if event.type in FAILURE_EVENTS:
        return "failed"
    return None


def _q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def _time(value: Any) -> dt.datetime:
    if isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
        except ValueError:
            pass
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < 2**33:
        return dt.datetime.fromtimestamp(value, tz=dt.UTC)
    return dt.datetime.now(tz=dt.UTC)


SYNTH = register(
    ProviderKind(
        name="synth",
        client=SynthProvider,
        key_env="SYNTH_API_KEY",
        default_url=lambda: settings.SYNTH_BACKEND_URL,
        url_setting="SYNTH_BACKEND_URL",
        row_format="synth",
        endpoint_kind="synth",
        endpoint_label="Training: synth learning API",
    )
)
