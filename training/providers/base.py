"""The small interface every training provider implements, and what it returns.

A provider turns the parsed config into request bodies (the same functions serve the real
call and `--dry-run`, so the preview is exactly what is sent), uploads files, creates and
starts a job, reads its state, events and metrics, and cancels it. It never sees the
database: services hand it plain values and store what it returns.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from training.config import TrainingConfig

# Our statuses (TrainingJob.Status values) that end a job.
TERMINAL = ("succeeded", "failed", "canceled")
MAX_MESSAGE_CHARS = 4000
# What one poll stores at most; a provider with more gives the rest to the next polls.
MAX_EVENTS_PER_POLL = 500
MAX_POINTS_PER_POLL = 2000
# Pages of events one poll reads at most: a provider that always says there is more is read a
# few pages a poll, each poll resuming where the last stopped.
MAX_EVENT_PAGES_PER_POLL = 5
# The requests one poll makes at most, whatever the provider answers: its status, its event
# pages and its metrics. How long a poll holds its job is computed from it.
REQUESTS_PER_POLL = 1 + MAX_EVENT_PAGES_PER_POLL + 1
# A file or job id as providers make them ("file-abc", "ftjob-abc", "sft_12:x"): it becomes
# part of a URL path, so nothing that could climb out of it ("..", "/", "%").
_REMOTE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}")
# A status as providers spell them ("running", "validating_files").
_STATUS_WORD = re.compile(r"[a-z][a-z_]{0,39}")
MAX_MODEL_ID_CHARS = 300


class ProviderError(Exception):
    """A call failed. `retryable` when trying again later may work (5xx, 429, network)."""

    def __init__(self, message: str, *, retryable: bool = False, status: int | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.status = status


@dataclass(frozen=True)
class UploadFile:
    """A file ready to upload: rows in the provider's format, hashed."""

    path: Path
    name: str
    sha256: str
    bytes: int
    rows: int
    # Called now and then while the file is read for sending (a long upload keeps its claim).
    heartbeat: Callable[[], None] | None = field(default=None, compare=False, repr=False)

    def open(self) -> IO[bytes]:
        handle = open(self.path, "rb")  # noqa: SIM115 (closed by the caller's `with`)
        return _Beating(handle, self.heartbeat) if self.heartbeat else handle

    def describe(self) -> dict[str, object]:
        if not self.sha256:  # a preview that did not build the file
            return {"filename": self.name, "rows": self.rows, "sha256": "computed when uploaded"}
        return {
            "filename": self.name,
            "bytes": self.bytes,
            "rows": self.rows,
            "sha256": self.sha256,
        }


class _Beating:
    """A binary file that calls `beat` at most every 15 s while it is read."""

    EVERY = 15.0

    def __init__(self, handle: IO[bytes], beat: Callable[[], None]) -> None:
        self._handle = handle
        self._beat = beat
        self._last = time.monotonic()
        self.name = handle.name

    def read(self, size: int = -1) -> bytes:
        if time.monotonic() - self._last >= self.EVERY:
            self._last = time.monotonic()
            self._beat()
        return self._handle.read(size)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._handle.seek(offset, whence)

    def tell(self) -> int:
        return self._handle.tell()

    def fileno(self) -> int:
        return self._handle.fileno()

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> _Beating:
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.close()


@dataclass(frozen=True)
class RemoteEvent:
    remote_id: str
    time: dt.datetime
    level: str = "info"
    type: str = ""
    message: str = ""
    step: int | None = None
    train_loss: float | None = None
    validation_loss: float | None = None
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RemoteState:
    status: str  # one of TrainingJob.Status values
    remote_status: str
    fine_tuned_model: str = ""
    trained_tokens: int | None = None
    error: str = ""


@dataclass(frozen=True)
class PlannedRequest:
    """One request as `--dry-run` shows it: never a key (the header says where it comes from)."""

    method: str
    url: str
    body: dict[str, Any]
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        data = {"method": self.method, "url": self.url, "body": self.body}
        if self.note:
            data["note"] = self.note
        return data


@dataclass(frozen=True)
class JobSpec:
    """What a remote job is created from: the config and the values only the studio knows."""

    config: TrainingConfig
    model: str
    training_file_id: str
    validation_file_id: str = ""
    metadata: dict[str, str] = field(default_factory=dict)


class Provider(Protocol):
    name: str
    base_url: str

    def plan(
        self, *, spec: JobSpec, training: UploadFile | None, validation: UploadFile | None
    ) -> list[PlannedRequest]: ...

    def upload(self, *, file: UploadFile, idempotency_key: str) -> str: ...

    def create_job(self, *, spec: JobSpec, idempotency_key: str) -> str: ...

    def start_job(self, *, remote_job_id: str) -> None: ...

    def state(self, *, remote_job_id: str) -> RemoteState: ...

    def events(self, *, remote_job_id: str, cursor: str) -> tuple[list[RemoteEvent], str]: ...

    def metrics(self, *, remote_job_id: str, after_step: int) -> tuple[list[RemoteEvent], int]: ...

    def cancel(self, *, remote_job_id: str) -> None: ...


def clean_text(value: Any, *, limit: int = MAX_MESSAGE_CHARS) -> str:
    """Provider text is untrusted: a string, no NUL or lone surrogates, bounded."""
    text = value if isinstance(value, str) else ("" if value is None else str(value))
    text = text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    return text[:limit]


def clean_number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer of 400 digits
        return None
    return number if math.isfinite(number) and abs(number) <= 1e12 else None


def clean_step(value: Any) -> int | None:
    """A step or sequence number: 0 <= n < 2**31, else None (`1e400`, NaN, -1, 2**63)."""
    number = clean_number(value)
    if number is None or not 0 <= number < 2**31:
        return None
    return int(number)


def remote_id(value: Any, what: str) -> str:
    """An id the provider gave, checked before it is stored or put in a URL."""
    if isinstance(value, str) and _REMOTE_ID.fullmatch(value) and value.strip(".") != "":
        return value
    raise ProviderError(f"{what} answered an unusable id: {clean_text(repr(value), limit=80)}")


def remote_status(value: Any, known: dict[str, str], what: str) -> tuple[str, str]:
    """(our status, the provider's) from the status a provider reported.

    A word we do not know yet is taken as running (a provider may add statuses); anything
    that is not a status word at all (`{"x": 1}`, a number, nothing) is an unusable answer,
    which the poll counts as failed.
    """
    if isinstance(value, str) and _STATUS_WORD.fullmatch(value.strip().lower()):
        remote = value.strip().lower()
        return known.get(remote, "running"), remote
    raise ProviderError(f"{what} answered an unusable status: {clean_text(repr(value), limit=80)}")


def model_id(value: Any, what: str) -> str:
    """The fine-tuned model's id as the provider named it, "" when it named none.

    It is printed by commands, copied into batches and sent back as a model name: one that
    holds control characters (an escape sequence for whoever prints it) or is not text is
    refused, as an unusable answer.
    """
    if value is None or value == "":
        return ""
    if isinstance(value, str) and len(value) <= MAX_MODEL_ID_CHARS and value.isprintable():
        return value
    shown = clean_text(repr(value), limit=80)
    raise ProviderError(f"{what} answered an unusable model id: {shown}")


def points_per_poll(points: list[tuple]) -> list[tuple]:
    """At most a poll's worth of (step, ...) metric points, whole steps only, oldest first.

    The metric cursor moves to the last step taken, so a step is never cut in two (its
    validation point would be skipped by the next poll's `after_step`).
    """
    points = sorted(points, key=lambda point: point[0])
    if len(points) <= MAX_POINTS_PER_POLL:
        return points
    last = points[MAX_POINTS_PER_POLL - 1][0]
    within = [point for point in points if point[0] < last]
    return within or [point for point in points if point[0] == last][:MAX_POINTS_PER_POLL]


def clean_data(value: Any, *, depth: int = 0) -> Any:
    """A JSON value from a provider, bounded in depth, size and text (for `event.data`)."""
    if depth > 4:
        return None
    if isinstance(value, dict):
        return {
            clean_text(k, limit=100): clean_data(v, depth=depth + 1)
            for k, v in list(value.items())[:50]
        }
    if isinstance(value, list):
        return [clean_data(v, depth=depth + 1) for v in value[:50]]
    if isinstance(value, str):
        return clean_text(value, limit=1000)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return clean_number(value)
    return clean_text(value, limit=200)
