"""The file a provider receives: the version's stored rows, in the provider's format.

Read line by line from storage (never whole: versions can be hundreds of MB), each row
converted (`curation.jsonl.row_for_provider`: which rows and what they say do not change),
checked against the limits its row format declares (`curation.row_formats`, as
`export_jsonl --format` checks them), written to a local temporary file and hashed as it
goes. The sha256 is of exactly the bytes uploaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from django.core.files.storage import default_storage

from curation.jsonl import dumps, row_for_provider
from curation.models import DatasetVersion
from curation.row_formats import row_format
from curation.validation import ProviderReport, Violation, _text_chars, check_row_dict
from training.providers import provider_kind
from training.providers.base import UploadFile

HEARTBEAT_ROWS = 500
# Which of a version's files: its training rows, or its own validation split.
Part = Literal["main", "val"]


@dataclass(frozen=True)
class ValidationSource:
    """Where a job's validation rows come from, and how many the version says there are."""

    version: DatasetVersion
    part: Part
    rows: int

    @property
    def is_split(self) -> bool:
        return self.part == "val"


def validation_source(
    *, version: DatasetVersion, validation_version: DatasetVersion | None
) -> ValidationSource | None:
    """An explicit validation version wins (all its rows); else the version's own split.

    The rows held out at export exist to measure the model on: not sending them would leave
    the provider no validation loss to report.
    """
    if validation_version is not None:
        return ValidationSource(validation_version, "main", validation_version.rows)
    rows = int(version.val.get("rows") or 0)
    if version.val.get("file") and rows:  # a split can come out empty: nothing to send
        return ValidationSource(version, "val", rows)
    return None


class DataRefused(ValueError):
    """The version's rows break the provider's limits; `lines` lists each problem."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        super().__init__(f"the data breaks the provider's limits: {len(lines)} problem(s)")


def upload_file_build(
    *,
    version: DatasetVersion,
    provider: str,
    role: str,
    directory: Path,
    label: str,
    part: Part = "main",
    heartbeat: Callable[[], None] | None = None,
) -> UploadFile:
    """Write `version`'s rows for `provider` under `directory`; DataRefused lists violations.

    `part` "val" reads the version's own validation split instead of its training rows.
    """
    stored = version.file.name if part == "main" else version.val.get("file", "")
    if version.status != DatasetVersion.Status.DONE or not stored:
        what = "file" if part == "main" else "validation split"
        raise DataRefused([f"{role}: dataset version {version.id} has no finished {what}"])
    if (version.export_options or {}).get("kind") == "preference":
        # Its rows are DPO pairs: uploaded to a supervised job they would train on neither.
        raise DataRefused(
            [
                f"{role}: dataset version {version.id} holds preference pairs; the providers "
                "here train on SFT rows (use Download for TRL or export_hf for DPO)"
            ]
        )
    declared = row_format(provider_kind(provider).row_format)
    name = f"{label}-{role}-{provider}.jsonl"
    path = directory / name
    report = ProviderReport(file=role)
    hasher = hashlib.sha256()
    size = rows = 0
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".jsonl")
    try:
        with os.fdopen(fd, "wb") as out, default_storage.open(stored, "rb") as source:
            for number, raw in enumerate(source, start=1):
                if not raw.strip():
                    continue
                try:
                    record = json.loads(raw)
                except ValueError as exc:
                    report.rows += 1
                    report.violations.append(Violation(number, f"not JSON ({exc})", role))
                    continue
                if not isinstance(record, dict):
                    report.rows += 1
                    report.violations.append(Violation(number, "not a JSON object", role))
                    continue
                row = row_for_provider(record, row_format=declared.name)
                line = (dumps(row) + "\n").encode("utf-8")
                text = line.decode("utf-8")
                check_row_dict(report, row=number, record=row, text_chars=_text_chars(row, text))
                if declared.upload_check is not None:
                    declared.upload_check(report, number, row)
                hasher.update(line)
                out.write(line)
                size += len(line)
                rows += 1
                if heartbeat is not None and rows % HEARTBEAT_ROWS == 0:
                    heartbeat()
        min_rows = declared.min_train_rows if role == "train" and declared.min_train_rows else 1
        report.finish(file_bytes=size, min_rows=min_rows)
        if not report.ok:
            raise DataRefused([str(v) for v in report.violations])
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    built = UploadFile(path=path, name=name, sha256=hasher.hexdigest(), bytes=size, rows=rows)
    return replace(built, heartbeat=heartbeat)
