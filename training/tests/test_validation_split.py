"""A version exported with a validation fraction sends its own validation rows as the job's
validation file, to both providers, in the real submission and in the dry run; an explicit
validation version wins."""

from __future__ import annotations

import json

import pytest
from django.core.files.storage import default_storage

from curation import services as dataset_services
from curation.export_options import ExportOptions
from curation.jsonl import episode_split, row_for_provider
from curation.models import DatasetVersion
from curation.tests.conftest import record
from rollouts.review.turn_selection import TurnSelection
from training import services
from training.models import TrainingJob
from training.submission import submission_build
from training.tests.conftest import REFERENCE
from training.tests.test_submit import stored_rows, wait_for

pytestmark = pytest.mark.django_db


def split_version(*, seeds: tuple[int, ...], steps: int, name: str) -> DatasetVersion:
    """A version exported with a validation fraction that puts about half the episodes in
    its validation split (the split hashes (batch, seed), so the fraction is picked for the
    batch just played: never all on one side)."""
    batch = record(seeds=seeds, steps=steps)
    fraction = min(
        (n / 64 for n in range(1, 64)),
        key=lambda f: abs(
            sum(episode_split(batch_id=batch.id, seed=s, val_fraction=f) == "val" for s in seeds)
            - len(seeds) / 2
        ),
    )
    dataset = dataset_services.dataset_create(
        name=name,
        filters=TurnSelection(batches=(batch.id,)),
        options=ExportOptions(val_fraction=fraction),
    )
    version = dataset_services.dataset_version_create(dataset=dataset, enqueue=False)
    assert dataset_services.dataset_version_export(version_id=version.id) == "done"
    version.refresh_from_db()
    assert version.rows and version.val["rows"], version.split
    return version


@pytest.fixture
def version_with_split(db) -> DatasetVersion:
    return split_version(seeds=(1, 2, 3, 4), steps=8, name="crafter split")


def stored_val_rows(version: DatasetVersion) -> list[dict]:
    with default_storage.open(version.val["file"], "rb") as fh:
        return [json.loads(line) for line in fh]


def episodes(rows: list[dict]) -> set[int]:
    return {row["metadata"]["episode_id"] for row in rows}


def submitted(version: DatasetVersion, provider: str, base_url: str, **extra) -> TrainingJob:
    submission = submission_build(
        config_text=REFERENCE.read_text(),
        provider=provider,
        version_id=version.id,
        base_url=base_url,
        **extra,
    )
    job = services.training_job_create(submission=submission, enqueue=False)
    assert services.training_job_submit(job_id=job.id) == "submitted"
    job.refresh_from_db()
    return job


def test_it_sends_the_versions_validation_split_to_synth(
    synth_server, version_with_split, client, submitter
):
    version = version_with_split
    job = submitted(version, "synth", synth_server.base_url)

    assert len(synth_server.uploads) == 2
    train = synth_server.uploads[job.remote_training_file_id]
    val = synth_server.uploads[job.remote_validation_file_id]
    # Exactly the version's validation rows, in synth's format; no episode in both files.
    expected = [row_for_provider(row, row_format="synth") for row in stored_val_rows(version)]
    assert val.rows() == expected
    assert len(val.rows()) == version.val["rows"] == job.validation_file_rows
    assert episodes(val.rows()) == episodes(stored_val_rows(version))
    assert episodes(val.rows()).isdisjoint(episodes(train.rows()))
    assert len(train.rows()) == version.rows == job.training_file_rows
    assert (job.validation_file_sha256, job.validation_file_bytes) == (
        val.sha256,
        len(val.content),
    )
    # Where synth-ai's run_fft_and_save.py puts it.
    body = synth_server.jobs[job.remote_job_id].body
    assert body["metadata"]["effective_config"]["data"]["validation_files"] == [
        job.remote_validation_file_id
    ]
    note = job.events.get(type="studio.uploaded", message__startswith="Validation file")
    assert f"from the validation split of version {version.id}" in note.message

    # The provider reports both losses; the page draws both and says where the rows came from.
    job = wait_for(job, "succeeded")
    client.force_login(submitter)
    page = client.get(f"/training/{job.id}/").content.decode()
    assert f"the validation split of crafter split v{version.number}" in page
    assert f"{version.val['rows']} rows)" in page
    assert 'class="val"' in page and "validation loss (0)" not in page


def test_it_sends_the_versions_validation_split_to_openai(openai_server, version_with_split):
    version = version_with_split
    job = submitted(version, "openai", openai_server.base_url)

    assert len(openai_server.uploads) == 2
    val = openai_server.uploads[job.remote_validation_file_id]
    # OpenAI's rows carry no metadata: the same rows, in order, are the same episodes' turns.
    expected = [row_for_provider(row, row_format="openai") for row in stored_val_rows(version)]
    assert val.rows() == expected
    assert len(val.rows()) == version.val["rows"] == job.validation_file_rows
    assert "metadata" not in val.rows()[0] and val.rows()[0]["tools"][0]["type"] == "function"
    assert job.validation_file_sha256 == val.sha256
    train = openai_server.uploads[job.remote_training_file_id]
    assert train.rows() == [
        row_for_provider(row, row_format="openai") for row in stored_rows(version)
    ]
    body = openai_server.jobs[job.remote_job_id].body
    assert body["validation_file"] == job.remote_validation_file_id
    assert body["training_file"] == job.remote_training_file_id


def test_an_explicit_validation_version_wins_over_the_split(
    synth_server, version_with_split, val_version, client, submitter
):
    job = submitted(
        version_with_split,
        "synth",
        synth_server.base_url,
        validation_version_id=val_version.id,
    )
    assert len(synth_server.uploads) == 2
    val = synth_server.uploads[job.remote_validation_file_id]
    assert episodes(val.rows()) == episodes(stored_rows(val_version))
    assert len(val.rows()) == val_version.rows == job.validation_file_rows
    client.force_login(submitter)
    page = client.get(f"/training/{job.id}/").content.decode()
    assert "validation version <a" in page and "crafter val v1</a>" in page
    assert "the validation split of" not in page


@pytest.mark.parametrize("provider", ["synth", "openai"])
def test_the_dry_run_shows_both_uploads(version_with_split, provider):
    submission = submission_build(
        config_text=REFERENCE.read_text(),
        provider=provider,
        version_id=version_with_split.id,
        base_url="http://127.0.0.1:9/api",
    )
    for build_files in (True, False):
        plans = services.training_job_plan(submission=submission, build_files=build_files)
        uploads = [p for p in plans if "file" in p.body]
        assert [u.body["file"]["rows"] for u in uploads] == [
            version_with_split.rows,
            version_with_split.val["rows"],
        ]
        (create,) = [p for p in plans if p.url.endswith("/jobs")]
        if provider == "openai":
            assert create.body["validation_file"] == "{validation_file_id}"
        else:
            data = create.body["metadata"]["effective_config"]["data"]
            assert data["validation_files"] == ["{validation_file_id}"]
        if build_files:
            assert uploads[1].body["file"]["sha256"] != "computed when uploaded"
