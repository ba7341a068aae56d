"""Submitting through the real worker to local providers, over real HTTP, to the end."""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

import pytest
from django.core.files.storage import default_storage
from django.db import connection

from curation.tests.conftest import run
from studio.testing import wait_for_row
from training import services
from training.jobs import SUBMISSION
from training.models import TrainingEvent, TrainingJob
from training.tests.conftest import OPENAI_KEY, REFERENCE, SYNTH_KEY, version_of
from training.tests.servers import Tick, failing_script

pytestmark = pytest.mark.django_db(transaction=True)

# The reference TOML mapped by hand, as synth-ai's run_fft_and_save.py builds its request
# (plus weight_decay, which that script dropped).
SYNTH_HYPERPARAMETERS = {
    "n_epochs": 1,
    "per_device_batch": 1,
    "gradient_accumulation_steps": 32,
    "sequence_length": 4096,
    "learning_rate": 1e-05,
    "warmup_ratio": 0.03,
    "weight_decay": 0.01,
    "train_kind": "fft",
    "parallelism": {
        "use_deepspeed": True,
        "deepspeed_stage": 2,
        "fsdp": False,
        "bf16": True,
        "fp16": False,
        "activation_checkpointing": True,
    },
    "evaluation_strategy": "steps",
    "eval_steps": 50,
    "save_best_model_at_end": True,
    "metric_for_best_model": "val.loss",
    "greater_is_better": False,
}
SYNTH_EFFECTIVE = {
    "compute": {"gpu_type": "A100", "gpu_count": 1, "nodes": 1},
    "data": {"topology": {}},
    "training": {"mode": "sft_offline", "use_qlora": False, "validation": {"enabled": True}},
}


def stored_rows(version) -> list[dict]:
    with default_storage.open(version.file.name, "rb") as fh:
        return [json.loads(line) for line in fh]


def submit(*args: str):
    return run("submit_training", "--config", str(REFERENCE), *args)


def wait_for(job: TrainingJob, *statuses: str, timeout: float = 60) -> TrainingJob:
    """Run the beat task's service until the job reaches one of `statuses`."""
    return wait_for_row(
        job,
        statuses=statuses,
        timeout=timeout,
        every=0.1,
        while_waiting=services.training_jobs_poll_active,
    )


def test_it_trains_on_synth_to_a_model_with_events_and_losses(
    celery_worker, synth_server, train_version
):
    synth_server.upload_failures = 1  # answered 500 once, then accepted
    outcome = submit(
        "--dataset-version", str(train_version.id), "--base-url", synth_server.base_url, "--wait"
    )
    assert outcome.code == 0, outcome.stderr
    summary = outcome.summary
    job = TrainingJob.objects.get()
    assert summary == {
        "job_id": job.id,
        "status": "succeeded",
        "provider": "synth",
        "remote_job_id": "sft-2",
        "fine_tuned_model": "ft:gpt-4o-mini:studio:crafter:abc123",
        "events": job.events.count(),
    }
    assert job.trained_tokens == 4242
    # One upload kept (after a 500), one job, one start; every request carried the key.
    assert len(synth_server.calls("POST", "/learning/files")) == 2
    assert len(synth_server.uploads) == 1
    assert len(synth_server.calls("POST", "/learning/jobs")) == 1
    assert len(synth_server.calls("POST", "/start")) == 1
    assert {r["authorization"] for r in synth_server.requests} == {f"Bearer {SYNTH_KEY}"}
    # The upload is the version's rows, tools flat for synth-ai's loader; the job records
    # the sha256 of exactly those bytes.
    (upload,) = synth_server.uploads.values()
    assert upload.purpose == "fine-tune"
    assert job.training_file_sha256 == upload.sha256
    assert job.training_file_rows == train_version.rows == 12
    rows, originals = upload.rows(), stored_rows(train_version)
    assert [r["messages"] for r in rows] == [r["messages"] for r in originals]
    assert rows[0]["tools"][0]["name"] == "interact_many"
    assert "function" not in rows[0]["tools"][0]
    body = synth_server.jobs["sft-2"].body
    assert body == {
        "model": "openai/gpt-4o-mini-2024-07-18",
        "training_file_id": "file-1",
        "training_type": "sft_offline",
        "hyperparameters": SYNTH_HYPERPARAMETERS,
        "metadata": {
            "effective_config": SYNTH_EFFECTIVE,
            "studio_job": str(job.id),
            "studio_submission": job.idempotency_key,
            "description": "Crafter VLM SFT (text + image prompts)",
        },
    }
    # Events and metrics arrive once each, whatever the number of polls.
    services.training_job_poll(job_id=job.id)
    types = list(job.events.exclude(type__startswith="studio.").values_list("type", flat=True))
    assert types.count("sft.completed") == 1
    train = job.events.exclude(train_loss=None).order_by("step")
    assert [(e.step, e.train_loss) for e in train] == [(1, 2.5), (2, 1.75), (3, 1.25)]
    val = job.events.exclude(validation_loss=None).order_by("step")
    assert [(e.step, e.validation_loss) for e in val] == [(2, 1.9), (3, 1.5)]
    assert "[job" in outcome.stderr and "Training finished" in outcome.stderr

    status = run("training_status", str(job.id))
    assert status.code == 0 and status.summary == summary


def test_it_trains_on_openai_through_the_openai_client_after_an_upload_error(
    celery_worker, openai_server, train_version, val_version
):
    openai_server.upload_failures = 1
    outcome = submit(
        "--dataset-version",
        str(train_version.id),
        "--validation-version",
        str(val_version.id),
        "--provider",
        "openai",
        "--base-url",
        openai_server.base_url,
        "--wait",
    )
    assert outcome.code == 0, outcome.stderr
    job = TrainingJob.objects.get()
    assert outcome.summary["status"] == "succeeded"
    assert job.fine_tuned_model == "ft:gpt-4o-mini:studio:crafter:abc123"
    # Three upload requests (one answered 500), two files kept, one job.
    assert len(openai_server.calls("POST", "/files")) == 3
    assert len(openai_server.uploads) == 2
    assert len(openai_server.calls("POST", "/fine_tuning/jobs")) == 1
    assert {r["authorization"] for r in openai_server.requests} == {f"Bearer {OPENAI_KEY}"}
    train, val = (
        openai_server.uploads[job.remote_training_file_id],
        openai_server.uploads[job.remote_validation_file_id],
    )
    assert (train.sha256, val.sha256) == (job.training_file_sha256, job.validation_file_sha256)
    assert "metadata" not in train.rows()[0]
    assert train.rows()[0]["tools"][0]["type"] == "function"
    assert len(val.rows()) == val_version.rows == 4
    body = openai_server.jobs[job.remote_job_id].body
    assert body == {
        "model": "gpt-4o-mini-2024-07-18",
        "training_file": job.remote_training_file_id,
        "validation_file": job.remote_validation_file_id,
        # batch_size: 1 per device x 32 accumulation x 1 GPU x 1 node
        "method": {
            "type": "supervised",
            "supervised": {"hyperparameters": {"n_epochs": 1, "batch_size": 32}},
        },
        "metadata": {"studio_job": str(job.id), "studio_submission": job.idempotency_key},
    }
    # OpenAI's metrics events carry the losses.
    train_losses = job.events.exclude(train_loss=None).order_by("step")
    assert [e.train_loss for e in train_losses] == [2.5, 1.75, 1.25]


def test_it_shows_a_failed_job_with_its_error(
    celery_worker, synth_server, train_version, client, viewer
):
    synth_server.script = failing_script()
    outcome = submit(
        "--dataset-version", str(train_version.id), "--base-url", synth_server.base_url, "--wait"
    )
    assert outcome.code == 1
    assert outcome.summary["status"] == "failed"
    job = TrainingJob.objects.get()
    assert job.error == "CUDA out of memory at step 2 <script>x</script>"
    assert job.events.filter(level="error", type="sft.failed").count() == 1
    client.force_login(viewer)
    page = client.get(f"/training/{job.id}/").content.decode()
    assert '<pre class="code error" id="job-error">CUDA out of memory at step 2 ' in page
    assert "&lt;script&gt;x&lt;/script&gt;" in page and "<script>x</script>" not in page


def test_it_cancels_a_running_job_at_the_provider(celery_worker, synth_server, train_version):
    synth_server.script = [Tick("running")] * 1000
    outcome = submit(
        "--dataset-version", str(train_version.id), "--base-url", synth_server.base_url
    )
    assert outcome.code == 0, outcome.stderr
    job = wait_for(TrainingJob.objects.get(), "running")
    services.training_job_cancel(job=job)
    job = wait_for(job, "canceled")
    assert len(synth_server.calls("POST", f"/learning/jobs/{job.remote_job_id}/cancel")) == 1
    assert job.cancel_requested and job.finished_at is not None


def test_it_cancels_a_job_not_yet_submitted_without_calling_anyone(synth_server, train_version):
    outcome = submit(
        "--dataset-version", str(train_version.id), "--base-url", synth_server.base_url
    )
    job = TrainingJob.objects.get(id=outcome.summary["job_id"])
    services.training_job_cancel(job=job)
    job.refresh_from_db()
    assert job.status == "canceled"
    assert services.training_job_submit(job_id=job.id) == "done_already"
    assert synth_server.requests == []


def test_it_prints_the_exact_requests_on_a_dry_run_and_sends_nothing(
    synth_server, openai_server, train_version
):
    outcome = submit(
        "--dataset-version",
        str(train_version.id),
        "--base-url",
        synth_server.base_url,
        "--dry-run",
    )
    assert outcome.code == 0, outcome.stderr
    summary = outcome.summary
    assert (summary["job_id"], summary["status"]) == (None, "dry_run")
    upload, create, start = summary["requests"]
    assert upload["url"] == synth_server.base_url + "/learning/files"
    assert upload["body"]["file"]["bytes"] > 0
    assert create["body"]["hyperparameters"] == SYNTH_HYPERPARAMETERS
    assert create["body"]["training_file_id"] == "{training_file_id}"
    assert start["url"].endswith("/learning/jobs/{id}/start")
    assert synth_server.requests == [] and TrainingJob.objects.count() == 0

    outcome = submit(
        "--dataset-version",
        str(train_version.id),
        "--provider",
        "openai",
        "--base-url",
        openai_server.base_url,
        "--dry-run",
    )
    _, create = outcome.summary["requests"]
    assert create["body"]["method"]["supervised"]["hyperparameters"] == {
        "n_epochs": 1,
        "batch_size": 32,
    }
    assert "[hyperparameters] learning_rate" in create["note"]
    assert openai_server.requests == []


def test_it_refuses_bad_input_with_one_line_each_and_creates_nothing(
    tmp_path, synth_server, train_version
):
    outcome = submit("--dataset-version", "999999", "--base-url", synth_server.base_url)
    assert outcome.code == 2
    assert outcome.stderr == "submit_training: error: dataset version: no dataset version 999999\n"

    bad = tmp_path / "bad.toml"
    bad.write_text(
        REFERENCE.read_text()
        .replace("learning_rate = 1e-5", "learning_rte = 1e-5")
        .replace("nodes = 1", "nodes = 0")
    )
    outcome = run(
        "submit_training",
        "--config",
        str(bad),
        "--dataset-version",
        str(train_version.id),
        "--base-url",
        synth_server.base_url,
    )
    assert outcome.code == 2
    assert outcome.stderr.splitlines() == [
        "submit_training: error: [compute] nodes (line 10): 0 is below the minimum 1",
        "submit_training: error: [hyperparameters] learning_rte (line 34): unknown key; "
        "did you mean learning_rate?",
    ]
    missing = run("submit_training", "--config", str(REFERENCE), "--base-url", "http://x")
    assert missing.code == 2
    assert TrainingJob.objects.count() == 0 and synth_server.requests == []


def test_it_refuses_data_over_the_providers_limits_before_uploading(openai_server, db):
    small = version_of(seeds=(3,), steps=4, name="too small")
    outcome = submit(
        "--dataset-version",
        str(small.id),
        "--provider",
        "openai",
        "--base-url",
        openai_server.base_url,
        "--dry-run",
    )
    assert outcome.code == 2
    assert outcome.stderr == (
        "submit_training: error: train file: 4 rows; at least 10 are needed\n"
    )
    job = services.training_job_create(
        submission=_submission(small, "openai", openai_server.base_url), enqueue=False
    )
    assert services.training_job_submit(job_id=job.id) == "failed"
    job.refresh_from_db()
    assert job.status == "failed"
    assert "train file: 4 rows; at least 10 are needed" in job.error
    assert openai_server.requests == []


def test_it_takes_the_newest_version_of_a_dataset_and_exports_one_when_none(
    synth_server, train_version
):
    from curation import services as dataset_services

    dataset = train_version.dataset
    outcome = submit("--dataset", str(dataset.id), "--base-url", synth_server.base_url, "--dry-run")
    assert outcome.code == 0, outcome.stderr
    fresh = dataset_services.dataset_create(
        name="never exported", filters=_filters_of(dataset), options=_options()
    )
    outcome = submit("--dataset", str(fresh.id), "--base-url", synth_server.base_url)
    assert outcome.code == 0, outcome.stderr
    job = TrainingJob.objects.get(id=outcome.summary["job_id"])
    assert job.dataset_version.dataset_id == fresh.id
    assert job.dataset_version.status == "done"


def test_it_never_stores_shows_or_logs_a_key(
    celery_worker, synth_server, train_version, caplog, client, admin_user
):
    caplog.set_level(logging.DEBUG)
    synth_server.script = failing_script(error="boom")
    outcome = submit(
        "--dataset-version", str(train_version.id), "--base-url", synth_server.base_url, "--wait"
    )
    job = TrainingJob.objects.get()
    assert synth_server.requests and all(
        r["authorization"] == f"Bearer {SYNTH_KEY}" for r in synth_server.requests
    )
    client.force_login(admin_user)
    pages = b"".join(
        client.get(url).content
        for url in (
            f"/training/{job.id}/",
            "/training/",
            f"/admin/training/trainingjob/{job.id}/change/",
        )
    )
    db = connection.settings_dict
    dump = subprocess.run(
        ["pg_dump", "-h", db["HOST"] or "127.0.0.1", "-U", db["USER"], "-d", db["NAME"]],
        capture_output=True,
        check=True,
    ).stdout
    assert b"trainingjob" in dump.lower() and str(job.idempotency_key).encode() in dump
    for where in (
        dump,
        pages,
        outcome.stdout.encode(),
        outcome.stderr.encode(),
        caplog.text.encode(),
    ):
        assert SYNTH_KEY.encode() not in where
        assert b"SECRET-4f1c" not in where


def _submission(version, provider, base_url):
    from training.submission import submission_build

    return submission_build(
        config_text=REFERENCE.read_text(),
        provider=provider,
        version_id=version.id,
        base_url=base_url,
    )


def _filters_of(dataset):
    from rollouts.review.turn_selection import TurnSelection

    return TurnSelection.from_json(dataset.filters)


def _options():
    from curation.export_options import ExportOptions

    return ExportOptions()


def test_events_are_unique_per_job_and_remote_id(train_version):
    job = services.training_job_create(
        submission=_submission(train_version, "synth", "http://127.0.0.1:9"), enqueue=False
    )
    from django.db import IntegrityError, transaction
    from django.utils import timezone

    TrainingEvent.objects.create(job=job, remote_id="seq:1", time=timezone.now())
    with pytest.raises(IntegrityError), transaction.atomic():
        TrainingEvent.objects.create(job=job, remote_id="seq:1", time=timezone.now())
    assert Path(REFERENCE).exists()


def test_it_retries_a_provider_that_is_down_and_fails_after_the_last_attempt(
    synth_server, train_version
):
    synth_server.create_failures = 1  # absorbed by the client's own retries
    job = services.training_job_create(
        submission=_submission(train_version, "synth", synth_server.base_url), enqueue=False
    )
    assert services.training_job_submit(job_id=job.id) == "submitted"

    synth_server.create_failures = 1000
    job = services.training_job_create(
        submission=_submission(train_version, "synth", synth_server.base_url), enqueue=False
    )
    assert services.training_job_submit(job_id=job.id) == "retry"
    job.refresh_from_db()
    assert (job.status, job.remote_job_id) == ("pending", "")
    assert job.remote_training_file_id  # kept: the next attempt does not upload again
    uploads = len(synth_server.uploads)
    assert services.training_job_submit(job_id=job.id, last_attempt=True) == "failed"
    job.refresh_from_db()
    assert job.status == "failed"
    assert "answered 503: " in job.error and "scripted create failure" in job.error
    assert len(synth_server.uploads) == uploads


def test_it_reads_the_dataset_from_the_config_and_names_an_unknown_one(
    tmp_path, synth_server, train_version
):
    config = tmp_path / "data.toml"
    text = REFERENCE.read_text()
    config.write_text(text.replace('# data = "examples', f'data = {train_version.id}\n# x = "'))
    outcome = run(
        "submit_training",
        "--config",
        str(config),
        "--dataset",
        str(train_version.dataset_id),
        "--base-url",
        synth_server.base_url,
        "--dry-run",
    )
    assert outcome.code == 0, outcome.stderr
    config.write_text(text.replace('# data = "examples', 'data = "no such dataset"\n# x = "'))
    outcome = run(
        "submit_training",
        "--config",
        str(config),
        "--dataset-version",
        str(train_version.id),
        "--base-url",
        synth_server.base_url,
    )
    assert outcome.code == 2
    assert outcome.stderr == (
        "submit_training: error: [job] data (line 4): unknown dataset 'no such dataset' "
        "(give a dataset version id or a dataset's name)\n"
    )
    assert TrainingJob.objects.count() == 0


def test_a_long_upload_keeps_its_claim_alive(
    synth_server, openai_server, train_version, tmp_path, monkeypatch
):
    from training.providers.base import _Beating
    from training.providers.openai import OpenAIProvider
    from training.providers.synth import SynthProvider
    from training.upload_files import upload_file_build

    monkeypatch.setattr(_Beating, "EVERY", 0.0)
    beats: list[int] = []
    built = upload_file_build(
        version=train_version,
        provider="synth",
        role="train",
        directory=tmp_path,
        label="beat",
        heartbeat=lambda: beats.append(1),
    )
    SynthProvider(base_url=synth_server.base_url, api_key="").upload(
        file=built, idempotency_key="k1"
    )
    assert len(beats) >= 1
    (upload,) = synth_server.uploads.values()
    assert upload.sha256 == built.sha256
    before = len(beats)
    OpenAIProvider(base_url=openai_server.base_url, api_key="").upload(
        file=built, idempotency_key="k2"
    )
    assert len(beats) > before


def test_a_browser_job_sends_its_endpoints_key_and_only_to_that_endpoint(
    synth_server, train_version, monkeypatch
):
    from studio.models import Endpoint
    from training.submission import submission_build

    monkeypatch.setenv("TEAM_SYNTH_KEY", "team-key-7d1e")
    endpoint = Endpoint.objects.create(
        name="team", kind="synth", base_url=synth_server.base_url, api_key_env="TEAM_SYNTH_KEY"
    )
    submission = submission_build(
        config_text=REFERENCE.read_text(), version_id=train_version.id, endpoint_name="team"
    )
    job = services.training_job_create(submission=submission, enqueue=False)
    assert (job.base_url, job.api_key_env) == (synth_server.base_url, "TEAM_SYNTH_KEY")
    assert services.training_job_submit(job_id=job.id) == "submitted"
    assert {r["authorization"] for r in synth_server.requests} == {"Bearer team-key-7d1e"}

    # An admin points the endpoint elsewhere: the job's old URL no longer gets the key.
    count = len(synth_server.requests)
    Endpoint.objects.filter(id=endpoint.id).update(base_url="http://127.0.0.1:9/api")
    assert services.training_job_poll(job_id=job.id) == "failed"
    job.refresh_from_db()
    assert "now points elsewhere" in job.error
    assert len(synth_server.requests) == count


def test_it_saves_a_job_says_one_line_and_submits_it_when_the_broker_is_back(
    broker_switch, synth_server, train_version, settings
):
    settings.STUDIO_REQUEUE_GRACE_SECONDS = 0
    broker_switch.down()
    outcome = submit(
        "--dataset-version", str(train_version.id), "--base-url", synth_server.base_url
    )
    assert outcome.code == 0
    assert outcome.stderr == (
        "the task queue is unreachable; the job will be submitted when it is back\n"
    )
    job = TrainingJob.objects.get(id=outcome.summary["job_id"])
    assert (job.status, job.enqueued_at) == ("pending", None)
    assert synth_server.requests == []
    broker_switch.up()
    assert SUBMISSION.requeue() == [job.id]  # what beat runs every minute
    job = wait_for(job, "submitted", "running", "succeeded")
    assert len(synth_server.calls("POST", "/learning/jobs")) == 1
