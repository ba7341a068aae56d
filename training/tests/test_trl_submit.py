"""The `trl` provider at submission: no URL nor key, settings it cannot honour refused with
one line each and nothing created, the version's Hugging Face export as what it trains on,
and the new-job form and job page saying where it runs. No training here (no torch needed).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from curation.models import DatasetVersion
from studio.testing import run_command
from training.models import LocalRun, TrainingEvent, TrainingJob
from training.tests.conftest import REFERENCE

TRL_TOML = Path(__file__).resolve().parents[1] / "configs" / "crafter_vlm_trl.toml"

pytestmark = pytest.mark.django_db


def submit(*args: str):
    return run_command("submit_training", "--provider", "trl", *args)


def test_it_needs_no_url_nor_key_and_plans_a_run_on_the_train_queue(train_version, monkeypatch):
    for name in ("SYNTH_BACKEND_URL", "SYNTH_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    outcome = submit(
        "--config", str(TRL_TOML), "--dataset-version", str(train_version.id), "--dry-run"
    )
    assert outcome.code == 0, outcome.stderr
    (request,) = outcome.summary["requests"]
    assert (request["method"], request["url"]) == ("QUEUE", "queue:train")
    assert request["body"]["base_model"] == "Qwen/Qwen2-VL-2B-Instruct"
    assert request["body"]["config"]["hyperparameters"]["max_steps"] == 40
    assert TrainingJob.objects.count() == 0


def test_it_refuses_what_trl_cannot_honour_one_line_each_creating_nothing(train_version, tmp_path):
    # synth-ai's reference asks for DeepSpeed on an A100 node and bf16: settings a single
    # process may not have; and two lines added here that no single machine can do.
    text = (
        REFERENCE.read_text()
        .replace("nodes = 1", "nodes = 2")
        .replace("fsdp = false", "fsdp = true")
    )
    config = tmp_path / "many-machines.toml"
    config.write_text(text)
    outcome = submit("--config", str(config), "--dataset-version", str(train_version.id))
    assert outcome.code == 2
    lines = [line for line in outcome.stderr.splitlines() if line.strip()]
    assert any(line.startswith("submit_training: error: [compute] nodes:") for line in lines)
    assert any("[hyperparameters.parallelism] fsdp:" in line for line in lines)
    # One line per setting: the two named above are not folded into one.
    assert len([line for line in lines if "nodes" in line]) == 1
    assert TrainingJob.objects.count() == 0 and LocalRun.objects.count() == 0


def test_it_refuses_a_version_without_its_hugging_face_export(train_version):
    DatasetVersion.objects.filter(id=train_version.id).update(hf_file="", hf_sha256="")
    outcome = submit("--config", str(TRL_TOML), "--dataset-version", str(train_version.id))
    assert outcome.code == 2
    assert f"dataset version {train_version.id}: no Hugging Face export" in outcome.stderr
    assert TrainingJob.objects.count() == 0


def test_it_refuses_a_job_without_a_base_model(train_version, tmp_path):
    config = tmp_path / "no-model.toml"
    config.write_text(TRL_TOML.read_text().replace('model = "Qwen/Qwen2-VL-2B-Instruct"', ""))
    outcome = submit("--config", str(config), "--dataset-version", str(train_version.id))
    assert outcome.code == 2
    assert "[job] model (line 6): missing" in outcome.stderr
    assert TrainingJob.objects.count() == 0


def test_the_form_submits_a_trl_job_without_an_endpoint(client, submitter, train_version):
    client.force_login(submitter)
    page = client.get("/training/new/")
    assert page.status_code == 200
    assert b"celery -A studio worker -Q train" in page.content
    assert b".[train]" in page.content
    response = client.post(
        "/training/new/",
        {
            "dataset_version": train_version.id,
            "provider": "trl",
            "endpoint": "",
            "model": "",
            "config": TRL_TOML.read_text(),
            "action": "submit",
        },
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    job = TrainingJob.objects.get()
    assert (job.provider, job.endpoint_name, job.api_key_env) == ("trl", "", "")
    assert job.base_url == "queue:train"
    # The config's base model: never the model that played the turns (none did here).
    assert job.model == "Qwen/Qwen2-VL-2B-Instruct"
    page = client.get(f"/training/{job.id}/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "Waiting for a train worker" in text
    assert "celery -A studio worker -Q train" in text


def test_the_form_still_asks_an_endpoint_of_a_provider_reached_by_url(
    client, submitter, train_version
):
    client.force_login(submitter)
    response = client.post(
        "/training/new/",
        {
            "dataset_version": train_version.id,
            "provider": "synth",
            "endpoint": "",
            "config": REFERENCE.read_text(),
            "action": "submit",
        },
    )
    assert response.status_code == 200
    assert b"the synth provider needs an endpoint" in response.content
    assert TrainingJob.objects.count() == 0


def test_the_submission_records_the_export_it_trains_on_and_queues_a_run(train_version, settings):
    from training import services
    from training.submission import submission_build

    submission = submission_build(
        config_text=TRL_TOML.read_text(), provider="trl", version_id=train_version.id
    )
    job = services.training_job_create(submission=submission, enqueue=False)
    assert services.training_job_submit(job_id=job.id) == "submitted"
    job.refresh_from_db()
    run = LocalRun.objects.get(job=job)
    assert job.remote_job_id == f"local-{run.id}"
    assert job.training_file_sha256 == train_version.hf_sha256
    assert job.training_file_rows == train_version.rows
    assert not job.remote_training_file_id  # nothing uploaded
    notes = list(TrainingEvent.objects.filter(job=job).values_list("message", flat=True))
    assert any(train_version.hf_sha256 in note for note in notes)
    assert run.status == "pending"
