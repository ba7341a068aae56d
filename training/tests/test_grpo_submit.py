"""Submitting a GRPO config ([training] mode = "grpo"): no dataset, the trl provider only.

From the command (its exit status and JSON last line, one-line errors that create nothing)
and from the form; the submission itself then queues the run like any trl job's."""

from __future__ import annotations

from pathlib import Path

import pytest

from curation.models import DatasetVersion
from studio.models import Endpoint
from studio.testing import run_command
from training import services
from training.models import LocalRun, TrainingEvent, TrainingJob
from training.tests.conftest import REFERENCE

GRPO_TOML = Path(__file__).resolve().parents[1] / "configs" / "crafter_vlm_grpo.toml"

pytestmark = pytest.mark.django_db


def submit(*args: str):
    return run_command("submit_training", *args)


def error_lines(outcome) -> list[str]:
    return [line for line in outcome.stderr.splitlines() if line.strip()]


def test_it_submits_a_grpo_config_without_a_dataset_to_the_trl_provider():
    outcome = submit("--config", str(GRPO_TOML), "--provider", "trl")
    assert outcome.code == 0, outcome.stderr
    job = TrainingJob.objects.get()
    assert job.dataset_version is None and job.validation_version is None
    assert (job.provider, job.base_url, job.api_key_env) == ("trl", "queue:train", "")
    assert job.model == "Qwen/Qwen2-VL-2B-Instruct"
    assert job.effective_config["training.grpo"]["group_size"] == 4
    assert outcome.summary == {
        "job_id": job.id,
        "status": "pending",
        "provider": "trl",
        "remote_job_id": None,
        "fine_tuned_model": None,
        "events": 1,
    }


def test_its_dry_run_plans_a_run_on_the_train_queue_and_creates_nothing():
    outcome = submit("--config", str(GRPO_TOML), "--provider", "trl", "--dry-run")
    assert outcome.code == 0, outcome.stderr
    assert outcome.summary["status"] == "dry_run" and outcome.summary["job_id"] is None
    (request,) = outcome.summary["requests"]
    assert (request["method"], request["url"]) == ("QUEUE", "queue:train")
    assert request["body"]["config"]["training"] == {"mode": "grpo"}
    assert request["body"]["training"] == "the episodes it plays (GRPO)"
    assert request["body"]["config"]["training.grpo"]["reward"] == "crafter"
    assert TrainingJob.objects.count() == 0


def test_a_dataset_with_a_grpo_config_is_one_line_and_exports_nothing(train_version):
    versions = DatasetVersion.objects.count()
    for flag, value in (
        ("--dataset-version", train_version.id),
        ("--dataset", train_version.dataset_id),
    ):
        outcome = submit("--config", str(GRPO_TOML), "--provider", "trl", flag, str(value))
        assert outcome.code == 2
        assert error_lines(outcome) == [
            f"submit_training: error: {flag}: a GRPO job trains on the episodes it plays, "
            "not on a dataset version; give none"
        ]
    assert TrainingJob.objects.count() == 0
    assert DatasetVersion.objects.count() == versions


def test_a_grpo_config_naming_a_dataset_is_refused_at_its_line(tmp_path):
    config = tmp_path / "grpo-data.toml"
    config.write_text(
        GRPO_TOML.read_text().replace("[job]\n", "[job]\ndata = 7\n", 1), encoding="utf-8"
    )
    outcome = submit("--config", str(config), "--provider", "trl")
    assert outcome.code == 2
    assert error_lines(outcome) == [
        "submit_training: error: [job] data (line 8): a GRPO job trains on the episodes it "
        "plays, not on a dataset version; remove it"
    ]
    assert TrainingJob.objects.count() == 0


@pytest.mark.parametrize("provider", ["synth", "openai"])
def test_grpo_with_a_provider_reached_by_url_names_the_mode(provider):
    outcome = submit("--config", str(GRPO_TOML), "--provider", provider)
    assert outcome.code == 2
    (line,) = error_lines(outcome)
    # The sample's `mode = "grpo"` is on line 14.
    assert line.startswith("submit_training: error: [training] mode (line 14): ")
    assert f"the {provider} provider cannot run it" in line and "trl" in line
    assert TrainingJob.objects.count() == 0


def test_a_config_that_is_not_grpo_still_needs_a_dataset():
    outcome = submit("--config", str(REFERENCE), "--provider", "trl")
    assert outcome.code == 2
    assert error_lines(outcome) == [
        "submit_training: error: one of the arguments --dataset-version --dataset is required"
    ]
    assert TrainingJob.objects.count() == 0


def test_a_config_that_is_not_toml_gets_its_own_error_not_the_missing_dataset(tmp_path):
    config = tmp_path / "broken.toml"
    config.write_text(GRPO_TOML.read_text().replace('mode = "grpo"', 'mode = "grpo'))
    outcome = submit("--config", str(config), "--provider", "trl")
    assert outcome.code == 2
    (line,) = error_lines(outcome)
    assert line.startswith("submit_training: error: config (line 14): not valid TOML")
    assert TrainingJob.objects.count() == 0


def test_a_grpo_config_with_a_typo_names_it(tmp_path):
    config = tmp_path / "typo.toml"
    config.write_text(GRPO_TOML.read_text().replace("group_size = 4", "group_sise = 4"))
    outcome = submit("--config", str(config), "--provider", "trl")
    assert outcome.code == 2
    assert error_lines(outcome) == [
        "submit_training: error: [training.grpo] group_sise (line 18): unknown key; "
        "did you mean group_size?"
    ]


def test_the_submission_queues_a_run_and_says_it_takes_no_dataset():
    outcome = submit("--config", str(GRPO_TOML), "--provider", "trl")
    job = TrainingJob.objects.get(id=outcome.summary["job_id"])
    assert services.training_job_submit(job_id=job.id) == "submitted"
    assert services.training_job_submit(job_id=job.id) == "done_already"
    job.refresh_from_db()
    assert job.status == "submitted" and job.remote_job_id
    assert LocalRun.objects.filter(job=job).count() == 1
    notes = TrainingEvent.objects.filter(job=job, type="studio.dataset")
    assert list(notes.values_list("message", flat=True)) == [
        "No dataset: a GRPO job trains on the episodes it plays"
    ]


def _form(**fields) -> dict:
    return {
        "provider": "trl",
        "endpoint": "",
        "model": "",
        "config": GRPO_TOML.read_text(),
        "action": "submit",
        **fields,
    }


def test_the_form_submits_a_grpo_job_without_a_dataset(client, submitter):
    client.force_login(submitter)
    response = client.post("/training/new/", _form())
    assert response.status_code == 302, response.content.decode()[:3000]
    job = TrainingJob.objects.get()
    assert job.dataset_version is None and job.provider == "trl"


def test_the_form_refuses_a_dataset_for_grpo_and_grpo_for_synth(client, submitter, train_version):
    client.force_login(submitter)
    response = client.post("/training/new/", _form(dataset_version=train_version.id))
    assert response.status_code == 200
    assert (
        b"a GRPO job trains on the episodes it plays, not on a dataset version: choose none"
        in response.content
    )
    Endpoint.objects.create(
        name="synth-prod", kind="synth", base_url="http://127.0.0.1:9/api", api_key_env="K"
    )
    response = client.post("/training/new/", _form(provider="synth", endpoint="synth-prod"))
    assert response.status_code == 200
    text = response.content.decode()
    assert "[training] mode (line 14): &quot;grpo&quot; plays Crafter" in text
    assert "the synth provider cannot run it" in text
    assert TrainingJob.objects.count() == 0


def test_the_form_still_asks_a_dataset_of_any_other_config(client, submitter, train_version):
    client.force_login(submitter)
    response = client.post("/training/new/", _form(config=REFERENCE.read_text()))
    assert response.status_code == 200
    assert b"This field is required (only a GRPO config" in response.content
    assert TrainingJob.objects.count() == 0
