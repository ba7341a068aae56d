"""Writes for uploaded imports: save the file, then a worker checks and imports it.

The web request only stores the upload and creates a `DatasetImport` row; the Celery task
claims the row (`curation.jobs.IMPORT`: a conditional UPDATE with a token),
reports progress on it and ends it as done (with the dataset) or failed (with every line
error). The rows of the import and the row's `done` commit in one transaction: a worker that
lost its claim cannot import the file a second time.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.core.files.storage import default_storage
from django.core.files.uploadedfile import UploadedFile
from django.db import connection, connections, transaction

from curation.importing import ImportFailed, import_file
from curation.jobs import IMPORT
from curation.models import DatasetImport
from studio.claims import Claim
from studio.errors import plain_error
from studio.jobs import ClaimLost, JobOutcome

logger = logging.getLogger(__name__)

# Progress is written at most this often.
REPORT_EVERY_SECONDS = 0.5


def _printable(name: str) -> str:
    return "".join(c for c in name if c.isprintable())[:200]


def dataset_import_create(
    *, upload: UploadedFile, name: str = "", skip_existing: bool = False, created_by=None
) -> DatasetImport:
    """Store the upload and a pending import row; the worker is sent once it is committed."""
    stored = default_storage.save(f"imports/{uuid.uuid4().hex}.jsonl", upload)
    with transaction.atomic():
        job = DatasetImport.objects.create(
            name=name,
            original_name=_printable(Path(upload.name or "upload.jsonl").name),
            upload=stored,
            skip_existing=skip_existing,
            total_bytes=upload.size or 0,
            created_by=created_by,
        )
        IMPORT.enqueue_on_commit(job.id)
    return job


def dataset_import_run(*, job_id: int) -> JobOutcome:
    """Claim a pending import and run it. Safe to run twice: the claim decides."""
    token = IMPORT.claim(
        job_id,
        phase=DatasetImport.Phase.CHECKING,
        checked_bytes=0,
        written_lines=0,
        error="",
        errors=[],
    )
    if token is None:
        return IMPORT.unclaimed(job_id)
    job = DatasetImport.objects.select_related("created_by").get(id=job_id)
    claim = IMPORT.held(job_id, token)
    reporter = _Reporter(claim)

    def finish(summary: dict[str, Any]) -> None:
        # In the import's own transaction: its rows commit only with this row's `done`.
        done = claim.finish(
            phase=DatasetImport.Phase.ENDED,
            summary=summary,
            dataset_id=summary["dataset_id"],
            written_lines=summary["turns"],
            total_lines=summary["turns"],
            checked_bytes=job.total_bytes,
        )
        if not done:
            raise ClaimLost(f"import {job_id} was claimed by another worker")

    try:
        with _local_copy(job.upload) as path:
            import_file(
                path=path,
                name=job.name,
                source_name=job.original_name or f"import {job.id}",
                created_by=job.created_by,
                skip_existing=job.skip_existing,
                on_checked=reporter.checked,
                on_planned=reporter.planned,
                on_written=reporter.written,
                finish=finish,
            )
    except ClaimLost:
        return "claim_lost"
    except ImportFailed as exc:
        _fail(claim, upload=job.upload, error=str(exc), errors=exc.errors)
        return "failed"
    except Exception as exc:  # a poison import is set aside with its error, never retried
        logger.exception("import %s failed", job_id)
        _fail(claim, upload=job.upload, error=plain_error(exc), errors=[])
        return "failed"
    _remove_upload(job.upload)
    return "done"


def _fail(claim: Claim, *, upload: str, error: str, errors: list[str]) -> None:
    ended = claim.fail(
        error,
        phase=DatasetImport.Phase.ENDED,
        # Line errors, each one line of the file: not the job's error.
        errors=[e[:2000] for e in errors],
    )
    if ended:
        _remove_upload(upload)


def _remove_upload(name: str) -> None:
    """The upload has served once the import ended; the row keeps what came of it."""
    default_storage.delete(name)


class _Reporter:
    """Writes progress and heartbeat to the row, at most every REPORT_EVERY_SECONDS.

    The write pass runs in one transaction; progress written from inside it would stay
    invisible until the end, so it goes through a connection of its own.
    """

    def __init__(self, claim: Claim) -> None:
        self.claim = claim
        self.last = 0.0

    def _update(self, force: bool = False, **fields: Any) -> None:
        now = time.monotonic()
        if not force and now - self.last < REPORT_EVERY_SECONDS:
            return
        self.last = now
        if not connection.in_atomic_block:
            self.claim.renew(raise_lost=True, **fields)
            return
        if connection.vendor == "sqlite":
            # One writer at a time: a second connection would wait on the write pass itself.
            return

        def outside() -> None:
            try:
                self.claim.renew(**fields)
            finally:
                connections.close_all()

        thread = threading.Thread(target=outside, name="import-progress")
        thread.start()
        thread.join()

    def checked(self, done: int) -> None:
        self._update(checked_bytes=done)

    def planned(self, lines: int) -> None:
        self._update(
            force=True, phase=DatasetImport.Phase.WRITING, total_lines=lines, written_lines=0
        )

    def written(self, lines: int) -> None:
        self._update(written_lines=lines)


@contextmanager
def _local_copy(name: str) -> Iterator[Path]:
    """A local path to the stored upload: itself on a file system, else a temporary copy."""
    try:
        yield Path(default_storage.path(name))
        return
    except NotImplementedError:
        pass
    tmpdir = tempfile.mkdtemp(prefix="studio-import-")
    try:
        path = Path(tmpdir, "upload.jsonl")
        with default_storage.open(name, "rb") as src, open(path, "wb") as dst:
            shutil.copyfileobj(src, dst, 1024 * 1024)
        yield path
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
