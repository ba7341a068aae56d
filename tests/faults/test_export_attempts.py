"""A dataset export whose worker was killed leaves nothing behind once the next attempt ran:
no temporary file beside its JSONL, no temporary folder, no archive stored under a second
name."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from curation import services
from curation.export_options import ExportOptions
from curation.exporting.files import FileResult, FileSink
from curation.jobs import EXPORT
from curation.models import DatasetVersion
from curation.tests.conftest import record
from rollouts.review.turn_selection import TurnSelection
from studio.testing import backdate

pytestmark = pytest.mark.django_db


def test_the_next_attempt_removes_what_a_killed_export_left_and_exports_whole(editor, settings):
    batch = record(seeds=(1, 2), steps=3)
    dataset = services.dataset_create(
        name="all",
        filters=TurnSelection(batches=(batch.id,)),
        options=ExportOptions(),
        created_by=editor,
    )
    version = services.dataset_version_create(dataset=dataset, created_by=editor, enqueue=False)
    name, _ = services.version_file_names(version)
    target = Path(default_storage.path(name))

    # The first attempt, killed mid-way: it held the claim, had written rows to its
    # temporary file (the export's own writer, never committed), had a temporary folder for
    # the Hugging Face dataset, and had stored the archive without recording it.
    assert EXPORT.claim(version.id) is not None
    sink = FileSink(target, FileResult(path=str(target)))
    sink.add('{"partial": true}\n' * 1000, episode_id=1, images=0)
    sink.flush()
    sink.fh.close()  # the process is gone: the file stays as it was
    folder = Path(tempfile.mkdtemp(prefix=services._hf_temp_prefix(version)))
    # Another studio on this host (another database) numbering its versions alike.
    neighbour = Path(tempfile.mkdtemp(prefix=f"studio-hf-0123456789-v{version.id}-"))
    (folder / "data.tmp-00000.parquet").write_bytes(b"\0" * 4096)
    archive = f"exports/dataset-{dataset.id}/v{version.number}.hf.zip"
    default_storage.save(archive, ContentFile(b"a partial archive"))
    left = {p.name for p in target.parent.iterdir()}
    assert len(left) == 2 and any(n.startswith(".tmp-export-") for n in left), left

    # Its heartbeat ages past the stale window: the next attempt takes it over.
    backdate(version, field="heartbeat_at", seconds=settings.STUDIO_EXPORT_STALE_SECONDS + 1)
    assert services.dataset_version_export(version_id=version.id) == "done"

    version.refresh_from_db()
    assert version.status == DatasetVersion.Status.DONE, version.error
    expected = [f"v{version.number}.hf.zip", target.name]
    assert sorted(p.name for p in target.parent.iterdir()) == expected
    assert version.hf_file.name == archive  # stored under its own name, not a second one
    assert not folder.exists()
    assert neighbour.exists()
    neighbour.rmdir()
    assert version.rows == 6 and b"partial" not in target.read_bytes()
