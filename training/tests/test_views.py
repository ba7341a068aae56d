"""Training pages: who may see and do what, the form's errors by line, preview, job page."""

from __future__ import annotations

import pytest

from studio.models import Endpoint
from training import services
from training.models import TrainingJob
from training.tests.conftest import REFERENCE
from training.tests.test_submit import _submission


@pytest.fixture
def synth_endpoint(db) -> Endpoint:
    return Endpoint.objects.create(
        name="synth-local",
        kind="synth",
        base_url="http://127.0.0.1:9/api",
        api_key_env="SYNTH_API_KEY",
    )


def form_data(version, **extra) -> dict:
    data = {
        "dataset_version": version.id,
        "provider": "synth",
        "endpoint": "synth-local",
        "config": REFERENCE.read_text(),
        "action": "preview",
    }
    data.update(extra)
    return data


def test_it_shows_the_training_pages_to_viewers_only(client, viewer, train_version):
    job = services.training_job_create(
        submission=_submission(train_version, "synth", "http://127.0.0.1:9/api"), enqueue=False
    )
    assert client.get("/training/").status_code == 302
    client.force_login(viewer)
    response = client.get("/training/")
    assert response.status_code == 200
    assert b"Training jobs" in response.content and b"New training job" not in response.content
    assert client.get(f"/training/{job.id}/").status_code == 200
    assert client.get("/training/new/").status_code == 403
    assert client.post(f"/training/{job.id}/cancel/").status_code == 403
    job.refresh_from_db()
    assert not job.cancel_requested


def test_it_prefills_the_reference_config_and_lists_endpoints(client, submitter, synth_endpoint):
    client.force_login(submitter)
    response = client.get("/training/new/")
    assert response.status_code == 200
    text = response.content.decode()
    assert "gradient_accumulation_steps = 32" in text
    assert "synth-local (synth, http://127.0.0.1:9/api)" in text


def test_it_shows_each_config_error_beside_its_line(
    client, submitter, synth_endpoint, train_version
):
    client.force_login(submitter)
    bad = REFERENCE.read_text().replace("learning_rate = 1e-5", "learning_rte = 1e-5")
    response = client.post(
        "/training/new/", form_data(train_version, config=bad), headers={"HX-Request": "true"}
    )
    text = response.content.decode()
    assert 'data-error-lines="34"' in text
    assert 'data-line="34"' in text
    assert "unknown key; did you mean learning_rate?" in text
    assert TrainingJob.objects.count() == 0
    # Submitting it is refused too, and nothing is created.
    response = client.post("/training/new/", form_data(train_version, config=bad, action="submit"))
    assert response.status_code == 200 and TrainingJob.objects.count() == 0


def test_it_previews_the_exact_request_without_sending(
    client, submitter, synth_endpoint, train_version
):
    client.force_login(submitter)
    response = client.post("/training/new/", form_data(train_version))
    text = response.content.decode()
    assert "POST http://127.0.0.1:9/api/learning/jobs" in text
    assert "&quot;gradient_accumulation_steps&quot;: 32" in text
    assert TrainingJob.objects.count() == 0


def test_it_refuses_an_endpoint_of_the_other_provider(
    client, submitter, synth_endpoint, train_version
):
    client.force_login(submitter)
    response = client.post("/training/new/", form_data(train_version, provider="openai"))
    assert "is not a openai endpoint" in response.content.decode().replace("an openai", "a openai")
    assert TrainingJob.objects.count() == 0


def test_it_submits_with_the_endpoints_url_and_key_variable(
    client, submitter, synth_endpoint, train_version, django_capture_on_commit_callbacks
):
    client.force_login(submitter)
    response = client.post("/training/new/", form_data(train_version, action="submit"))
    job = TrainingJob.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/training/{job.id}/"
    assert (job.base_url, job.api_key_env, job.endpoint_name) == (
        "http://127.0.0.1:9/api",
        "SYNTH_API_KEY",
        "synth-local",
    )
    assert job.created_by == submitter
    assert job.config_toml == REFERENCE.read_text()


def test_it_shows_the_error_in_full_and_escaped(client, viewer, train_version):
    job = services.training_job_create(
        submission=_submission(train_version, "synth", "http://127.0.0.1:9/api"), enqueue=False
    )
    long_error = "<script>alert(1)</script>\n" + "x" * 5000
    TrainingJob.objects.filter(id=job.id).update(status="failed", error=long_error)
    client.force_login(viewer)
    text = client.get(f"/training/{job.id}/").content.decode()
    assert "<script>alert(1)</script>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\n" + "x" * 5000 in text


def test_it_lets_a_submitter_cancel_a_pending_job(client, submitter, train_version):
    job = services.training_job_create(
        submission=_submission(train_version, "synth", "http://127.0.0.1:9/api"), enqueue=False
    )
    client.force_login(submitter)
    assert "Cancel job" in client.get(f"/training/{job.id}/").content.decode()
    response = client.post(f"/training/{job.id}/cancel/")
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.status == "canceled"


def test_it_tags_each_endpoint_with_its_provider_and_picks_a_lone_version(
    client, submitter, synth_endpoint, train_version
):
    Endpoint.objects.create(
        name="openai-local", kind="openai", base_url="http://127.0.0.1:9/v1", api_key_env="K"
    )
    client.force_login(submitter)
    form = client.get("/training/new/").context["form"]
    assert (form["dataset_version"].value(), form["endpoint"].value()) == (
        train_version.id,
        "synth-local",
    )
    html = str(form["endpoint"])
    assert '<option value="synth-local" selected data-kind="synth">' in html
    assert '<option value="openai-local" data-kind="openai">' in html
    # Two versions: the person chooses.
    from training.tests.conftest import version_of

    version_of(seeds=(2,), steps=4, name="second")
    assert client.get("/training/new/").context["form"]["dataset_version"].value() is None


def test_it_keeps_config_errors_on_their_lines_when_another_field_is_wrong(
    client, submitter, synth_endpoint, train_version
):
    client.force_login(submitter)
    bad = REFERENCE.read_text().replace("learning_rate = 1e-5", "learning_rte = 1e-5")
    data = form_data(train_version, config=bad, provider="openai")
    for headers in ({}, {"HX-Request": "true"}):  # Preview's round trip, and the live check
        text = client.post("/training/new/", data, headers=headers).content.decode()
        assert 'data-error-lines="34"' in text
        assert "learning_rte (line 34): unknown key" in text
        assert "Endpoint: &#x27;synth-local&#x27; is not a openai endpoint" in text
    assert TrainingJob.objects.count() == 0
