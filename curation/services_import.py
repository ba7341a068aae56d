"""Writes for uploaded imports: save the file, then a worker checks and imports it.

The web request only stores the upload and creates a `DatasetImport` row; the Celery task
claims the row (`studio.claims.job_claim`: a conditional UPDATE with a token),
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
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from django.core.files.storage import default_storage
from django.core.files.uploadedfile import UploadedFile
from django.db import connection, connections, transaction

from curation.importing import ImportFailed, import_file
from curation.models import DatasetImport
from studio import claims, queue
from studio.errors import plain_error

logger = logging.getLogger(__name__)

ImportOutcome = Literal["done", "failed", "busy", "done_already", "claim_lost"]
# A running import that has not reported for this long is presumed dead and may be re-claimed.
STALE_AFTER = timedelta(minutes=10)
# Progress is written at most this often.
REPORT_EVERY_SECONDS = 0.5


class ClaimLost(Exception):
    """Another worker took the import over (this one was presumed dead)."""


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
        transaction.on_commit(lambda: dataset_import_enqueue(job_id=job.id))
    return job


def dataset_import_enqueue(*, job_id: int) -> bool:
    from curation.tasks import dataset_import_run as task

    return queue.send_job(DatasetImport, task, job_id)


def dataset_import_run(*, job_id: int) -> ImportOutcome:
    """Claim a pending import and run it. Safe to run twice: the claim decides."""
    token = claims.job_claim(
        model=DatasetImport,
        pk=job_id,
        stale_after=STALE_AFTER,
        phase=DatasetImport.Phase.CHECKING,
        checked_bytes=0,
        written_lines=0,
        error="",
        errors=[],
    )
    if token is None:
        status = DatasetImport.objects.filter(id=job_id).values_list("status", flat=True).first()
        return "busy" if status == DatasetImport.Status.RUNNING else "done_already"
    job = DatasetImport.objects.select_related("created_by").get(id=job_id)
    mine = {"model": DatasetImport, "pk": job_id, "token": token}
    reporter = _Reporter(job_id=job_id, token=token)

    def finish(summary: dict[str, Any]) -> None:
        # In the import's own transaction: its rows commit only with this row's `done`.
        done = claims.job_finish(
            **mine,
            phase=DatasetImport.Phase.ENDED,
            summary=summary,
            dataset_id=summary["dataset_id"],
            written_lines=summary["turns"],
            total_lines=summary["turns"],
            checked_bytes=job.total_bytes,
        )
        if not done:
            raise ClaimLost

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
        _fail(mine, upload=job.upload, error=str(exc), errors=exc.errors)
        return "failed"
    except Exception as exc:  # a poison import is set aside with its error, never retried
        logger.exception("import %s failed", job_id)
        _fail(mine, upload=job.upload, error=plain_error(exc), errors=[])
        return "failed"
    _remove_upload(job.upload)
    return "done"


def _fail(mine: dict, *, upload: str, error: str, errors: list[str]) -> None:
    ended = claims.job_fail(
        **mine,
        error=error[:4000],
        phase=DatasetImport.Phase.ENDED,
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

    def __init__(self, *, job_id: int, token: str) -> None:
        self.mine = {"model": DatasetImport, "pk": job_id, "token": token}
        self.last = 0.0

    def _update(self, force: bool = False, **fields: Any) -> None:
        now = time.monotonic()
        if not force and now - self.last < REPORT_EVERY_SECONDS:
            return
        self.last = now
        if not connection.in_atomic_block:
            if not claims.job_heartbeat(**self.mine, **fields):
                raise ClaimLost
            return
        if connection.vendor == "sqlite":
            # One writer at a time: a second connection would wait on the write pass itself.
            return

        def outside() -> None:
            try:
                claims.job_heartbeat(**self.mine, **fields)
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


def dataset_imports_requeue() -> int:
    """Send again imports never sent (broker down), long unstarted, or whose worker died."""
    from curation.tasks import dataset_import_run as task

    ids = claims.jobs_to_resend(rows=DatasetImport.objects.all(), stale_after=STALE_AFTER)
    return queue.resend(DatasetImport, task, ids)
