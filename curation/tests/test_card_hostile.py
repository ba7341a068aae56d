"""The dataset card writes names as text, never as YAML or markdown.

A dataset named "x\\n---\\nlicense: evil\\n# Owned <script>" used to go into README.md
verbatim: its lines became a rule, a heading and raw HTML on the card's page.
"""

from __future__ import annotations

import io
import json
import zipfile

import pytest
import yaml
from django.core.files.storage import default_storage

from curation import services
from curation.export_options import ExportOptions
from curation.models import DatasetVersion
from curation.tests.conftest import record
from rollouts.models import RolloutBatch
from rollouts.review.turn_selection import TurnSelection

pytestmark = pytest.mark.django_db

HOSTILE_NAME = "x\n---\nlicense: evil\n# Owned <script>alert(1)</script>\u2028tags: [evil]"
HOSTILE_BATCH = "b`</code><script>alert(2)</script>\n# also"


def _card_of(version: DatasetVersion) -> str:
    with default_storage.open(version.hf_file.name, "rb") as fh:
        archive = zipfile.ZipFile(io.BytesIO(fh.read()))
    (name,) = [n for n in archive.namelist() if n.endswith("/README.md")]
    return archive.read(name).decode("utf-8")


def test_it_writes_a_hostile_dataset_name_into_the_card_as_plain_text():
    batch = record(seeds=(1,), steps=3)
    RolloutBatch.objects.filter(id=batch.id).update(name=HOSTILE_BATCH)
    dataset = services.dataset_create(
        name=HOSTILE_NAME,
        filters=TurnSelection(batches=(batch.id,)),
        options=ExportOptions(val_fraction=0.0),
    )
    version = services.dataset_version_create(dataset=dataset, enqueue=False)
    services.dataset_version_export(version_id=version.id)
    version.refresh_from_db()
    assert version.status == DatasetVersion.Status.DONE, version.error

    card = _card_of(version)
    assert card.startswith("---\n")
    front, body = card[len("---\n") :].split("\n---\n", 1)
    assert set(yaml.safe_load(front)) == {"dataset_info", "configs", "tags"}
    assert "<script" not in card and "</code" not in card
    lines = body.splitlines()
    # One heading, the title, holding the whole name on its one line.
    assert [line for line in lines if line.lstrip().startswith("#")] == [lines[0]]
    assert lines[0].startswith("# x ") and lines[0].endswith(" v1")
    assert "&lt;script&gt;" in lines[0]
    assert not any(line.strip() == "---" or line.startswith("license") for line in lines)
    # The batch's name is still there, in JSON that reads back to it.
    (batches,) = [line for line in lines if line.startswith("- Batches: ")]
    span = batches[len("- Batches: ") :]
    assert span.count("`") == 2 and span.startswith("`") and span.endswith("`")
    assert json.loads(span.strip("`"))[0]["name"] == HOSTILE_BATCH
