"""Two uploads of one file at once import it once.

The "already imported" check of pass one ran outside the write transaction: two imports of
the same 40 lines started together both passed it and both wrote (80 turns).
"""

from __future__ import annotations

import threading

import pytest
from django.core.files.storage import default_storage
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection, connections, transaction

from curation.models import Dataset, DatasetImport
from curation.services_import import dataset_import_run
from curation.tests.test_import_hostile import good_row
from rollouts.models import RolloutBatch, Turn
from studio.testing import wait_until

LINES = 40


def _stored_job(content: bytes) -> DatasetImport:
    """An import as the upload page leaves it: the file stored, the row pending."""
    stored = default_storage.save("imports/same.jsonl", SimpleUploadedFile("same.jsonl", content))
    return DatasetImport.objects.create(
        upload=stored, original_name="same.jsonl", total_bytes=len(content)
    )


def _waiting_backends() -> int:
    """Sessions of this test database waiting for a lock (pg_locks is live, not a snapshot)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(DISTINCT pid) FROM pg_locks WHERE NOT granted AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        return cursor.fetchone()[0]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite serialises writes")
@pytest.mark.django_db(transaction=True)
def test_it_imports_a_file_once_when_two_workers_import_it_at_once():
    content = "".join(good_row(f"observation {n}") + "\n" for n in range(LINES)).encode()
    jobs = [_stored_job(content), _stored_job(content)]
    outcomes: dict[int, str] = {}

    def work(job_id: int) -> None:
        try:
            outcomes[job_id] = dataset_import_run(job_id=job_id)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=work, args=(job.id,)) for job in jobs]
    # Writes to the batch table wait while this transaction holds it, so both imports are
    # in flight together: each has checked the file before either has written a row.
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"LOCK TABLE {RolloutBatch._meta.db_table} IN SHARE ROW EXCLUSIVE MODE")
        for thread in threads:
            thread.start()
        wait_until(
            lambda: _waiting_backends() >= 2,
            timeout=60,
            what="the two imports both to reach the write",
        )
    for thread in threads:
        thread.join(timeout=120)
        assert not thread.is_alive()

    assert sorted(outcomes.values()) == ["done", "failed"], outcomes
    assert Turn.objects.count() == LINES
    assert RolloutBatch.objects.count() == Dataset.objects.count() == 1
    done = DatasetImport.objects.get(status="done")
    refused = DatasetImport.objects.get(status="failed")
    assert done.summary["turns"] == LINES
    batch = RolloutBatch.objects.get()
    assert refused.errors == [
        f"this file was imported already (batch {batch.id}); import with --skip-existing "
        "(or tick 'Skip turns already here') to leave known turns out"
    ]
