"""Dataset versions: exported by a real Celery worker, immutable, same content same bytes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.core.files.storage import default_storage

from curation import services
from curation.export_options import ExportOptions
from curation.models import DatasetVersion
from curation.tests.conftest import read_rows, record
from rollouts.review.turn_selection import TurnSelection
from studio.testing import JOB_ENDS, wait_for_row


def test_it_exports_versions_on_the_worker_with_the_same_bytes_for_the_same_content(
    celery_worker, editor
):
    batch = record(seeds=tuple(range(1, 13)), steps=3)
    # The split hashes "batch:seed" and the database picks the batch id; a fraction just
    # above the smallest hash (worked out here, apart from the exporter) puts >= 1 in val.
    hashes = [
        int.from_bytes(hashlib.sha256(f"{batch.id}:{seed}".encode()).digest()[:8], "big") / 2**64
        for seed in range(1, 13)
    ]
    val_fraction = max(0.34, min(hashes) + 0.01)
    dataset = services.dataset_create(
        name="all",
        filters=TurnSelection(batches=(batch.id,)),
        options=ExportOptions(val_fraction=val_fraction, history_frames=1),
        created_by=editor,
    )
    first = wait_for_row(
        services.dataset_version_create(dataset=dataset, created_by=editor),
        statuses=JOB_ENDS,
        timeout=120,
    )
    assert first.status == DatasetVersion.Status.DONE, first.error
    assert first.number == 1 and first.created_by == editor
    path = Path(default_storage.path(first.file.name))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == first.sha256
    val_path = Path(default_storage.path(first.val["file"]))
    assert hashlib.sha256(val_path.read_bytes()).hexdigest() == first.val["sha256"]
    assert first.rows + first.val["rows"] == 36 == first.progress_rows == first.total_rows
    assert first.episodes + first.val["episodes"] == 12
    train_eps = {r["metadata"]["episode_id"] for r in read_rows(path)}
    val_eps = {r["metadata"]["episode_id"] for r in read_rows(val_path)}
    assert not train_eps & val_eps and val_eps
    assert first.filters == dataset.filters and first.export_options == dataset.export_options

    # Editing the dataset later does not touch the version's snapshot.
    services.dataset_update(
        dataset=dataset,
        name="all",
        filters=TurnSelection(batches=(batch.id,), flagged="only"),
        options=ExportOptions(),
    )
    first.refresh_from_db()
    assert first.filters["flagged"] == "any"
    services.dataset_update(
        dataset=dataset,
        name="all",
        filters=TurnSelection(batches=(batch.id,)),
        options=ExportOptions(val_fraction=val_fraction, history_frames=1),
    )
    second = wait_for_row(
        services.dataset_version_create(dataset=dataset, created_by=editor),
        statuses=JOB_ENDS,
        timeout=120,
    )
    assert second.number == 2 and second.sha256 == first.sha256
    assert second.val["sha256"] == first.val["sha256"]

    # Done is final: a redelivered task changes nothing, and the row refuses to be saved.
    assert services.dataset_version_export(version_id=first.id) == "done_already"
    first.rows = 0
    with pytest.raises(ValidationError):
        first.save()


def test_it_records_a_refused_export_as_failed_with_the_report(celery_worker, editor):
    batch = record(seeds=(1,), steps=3)
    dataset = services.dataset_create(
        name="tiny",
        filters=TurnSelection(batches=(batch.id,)),
        options=ExportOptions(format="openai"),
    )
    version = wait_for_row(
        services.dataset_version_create(dataset=dataset), statuses=JOB_ENDS, timeout=120
    )
    assert version.status == DatasetVersion.Status.FAILED
    assert "train file: 3 rows; at least 10 are needed" in version.error
    assert not version.sha256 and not version.file
    assert not default_storage.exists(f"exports/dataset-{dataset.id}/v1.jsonl")
