"""Each version also as a Hugging Face dataset: "Download for TRL"."""

from __future__ import annotations

import hashlib
import io
import zipfile

import pytest
from django.urls import reverse

from curation import services
from curation.export_options import ExportOptions
from curation.models import DatasetVersion
from curation.tests.conftest import read_rows, record
from curation.tests.hf_reader import read_hf, val_fraction_between
from rollouts.review.turn_selection import TurnSelection

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("row_format", ["studio", "openai"])
def test_a_version_downloads_for_trl_as_the_same_rows(viewer_client, tmp_path, row_format):
    batch = record(seeds=(1, 2, 3, 4), steps=12)
    dataset = services.dataset_create(
        name="For TRL",
        filters=TurnSelection(batches=(batch.id,)),
        options=ExportOptions(
            val_fraction=val_fraction_between(batch.id, (1, 2, 3, 4)), format=row_format
        ),
    )
    version = services.dataset_version_create(dataset=dataset, enqueue=False)
    services.dataset_version_export(version_id=version.id)
    version.refresh_from_db()
    assert version.status == DatasetVersion.Status.DONE, version.error
    assert version.hf_sha256

    page = viewer_client.get(reverse("datasets:dataset_detail", args=[dataset.id]))
    assert b"Download for TRL" in page.content
    response = viewer_client.get(
        reverse("datasets:version_download", args=[version.id]), {"file": "hf"}
    )
    assert response.status_code == 200
    assert response["Content-Disposition"].endswith('for-trl-v1-hf.zip"')
    data = b"".join(response.streaming_content)
    assert hashlib.sha256(data).hexdigest() == response["X-Content-SHA256"] == version.hf_sha256
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        archive.extractall(tmp_path / "unzipped")
    read = read_hf(tmp_path / "unzipped" / "for-trl-v1-hf", ("turn",), tmp_path / "reader")
    counts = {split: len(d["rows"]) for split, d in read["disk"].items()}
    assert counts == {"train": version.rows, "validation": version.val["rows"]}
    if row_format == "studio":
        from django.core.files.storage import default_storage

        rows = read_rows(default_storage.path(version.file.name))
        assert [r["turn"] for r in read["parquet"]["train"]["rows"]] == [
            r["metadata"]["turn"] for r in rows
        ]
