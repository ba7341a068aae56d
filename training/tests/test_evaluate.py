"""A succeeded job's Evaluate: held-out seeds, real batches, the base model, the comparison."""

from __future__ import annotations

import html
import re

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from curation.tests.conftest import record
from evaluation import services as evaluation_services
from rollouts.models import Episode, RolloutBatch
from rollouts.tests.helpers import BATCH_ENDS
from studio.testing import wait_for_row
from training import services
from training.models import TrainingJob
from training.tests.conftest import version_of
from training.tests.test_submit import _submission

FINE_TUNED = "ft:gpt-4o-mini-2024-07-18:studio:crafter:e1"
BASE = "openai/gpt-4o-mini-2024-07-18"  # the reference config's model (worked out by hand)


def _job(*, seeds: tuple[int, ...], status: str = "succeeded") -> TrainingJob:
    """A job over a dataset version of a batch that played `seeds`; succeeded as a provider
    would leave it (remote id and fine-tuned model)."""
    version = version_of(seeds=seeds, steps=4, name="crafter train")
    job = services.training_job_create(
        submission=_submission(version, "synth", "http://127.0.0.1:9/api"), enqueue=False
    )
    TrainingJob.objects.filter(id=job.id).update(
        status=status,
        remote_job_id="sft-remote-1",
        fine_tuned_model=FINE_TUNED if status == "succeeded" else "",
    )
    job.refresh_from_db()
    assert job.model == BASE
    return job


def _finished_base_batch(*, seeds, steps: int, model: str = BASE) -> RolloutBatch:
    """A finished base-model batch, as a batch of another day would have left it."""
    batch = RolloutBatch.objects.create(
        policy="openai",
        model=model,
        seeds=list(seeds),
        step_limit=steps,
        status="finished",
        settings={"observation_mode": "image_text", "history_frames": 0},
    )
    Episode.objects.bulk_create(
        Episode(batch=batch, seed=s, status="finished", achievements={"collect_wood": 1})
        for s in seeds
    )
    return batch


@pytest.mark.django_db(transaction=True)
def test_evaluate_plays_held_out_seeds_then_the_base_model_then_links_the_comparison(
    client, editor, celery_worker, chat_server, chat_endpoint
):
    job = _job(seeds=(0, 2))
    record(seeds=(1,), steps=2)  # a batch outside the dataset: its seed stays available
    trained_batches = job.dataset_version.filters["batches"]
    training_seeds = set(
        Episode.objects.filter(batch_id__in=trained_batches).values_list("seed", flat=True)
    )
    assert training_seeds == {0, 2}
    client.force_login(editor)  # may start batches; has no training permission
    page = client.get(f"/training/{job.id}/").content.decode()
    assert 'id="evaluate-job"' in page and "data-evaluate-form" in page
    assert re.search(r'id="held-out-seeds">([^<]*)<', page).group(1) == "1,3-21"

    form = {"count": 3, "steps": 3, "endpoint": chat_endpoint.name}
    response = client.post(f"/training/{job.id}/evaluate/", form)
    assert response.status_code == 302
    tuned = wait_for_row(
        RolloutBatch.objects.get(model=FINE_TUNED), statuses=BATCH_ENDS, timeout=120
    )
    assert tuned.status == "finished", tuned.error
    # The three smallest seeds the version never played: 1, 3, 4 (0 and 2 were trained on).
    assert tuned.seeds == [1, 3, 4]
    assert not set(tuned.seeds) & training_seeds
    assert tuned.evaluates_id == job.id and tuned.policy == "openai" and tuned.step_limit == 3
    assert tuned.endpoint_name == "local-test" and tuned.endpoint == chat_server.url
    assert {r.body["model"] for r in chat_server.requests} == {FINE_TUNED}
    assert len(chat_server.requests) == 9  # three seeds, three steps each

    # Pressing again plays nothing twice.
    assert client.post(f"/training/{job.id}/evaluate/", form).status_code == 302
    assert RolloutBatch.objects.filter(evaluates=job).count() == 1

    page = client.get(f"/training/{job.id}/").content.decode()
    assert f'data-batch="{tuned.id}" data-role="fine-tuned"' in page
    assert "compare-link" not in page
    assert 'data-action="evaluate-base"' in page
    batch_page = client.get(f"/rollouts/{tuned.id}/").content.decode()
    assert f"Training job #{job.id}" in batch_page and "compare-link" not in batch_page

    response = client.post(f"/training/{job.id}/evaluate/{tuned.id}/base/")
    assert response.status_code == 302
    base = wait_for_row(RolloutBatch.objects.get(model=BASE), statuses=BATCH_ENDS, timeout=120)
    assert base.status == "finished", base.error
    assert (base.seeds, base.step_limit, base.evaluates_id) == ([1, 3, 4], 3, job.id)
    assert base.endpoint_name == "local-test"
    assert len(chat_server.requests) == 18

    link = f'href="/compare/?batches={base.id},{tuned.id}"'
    page = client.get(f"/training/{job.id}/").content.decode()
    assert link in page and 'data-action="evaluate-base"' not in page
    assert f'data-batch="{base.id}" data-role="base"' in page
    assert link in client.get(f"/rollouts/{tuned.id}/").content.decode()
    assert client.get(f"/compare/?batches={base.id},{tuned.id}").status_code == 200
    # Once covered, the base button starts nothing more.
    client.post(f"/training/{job.id}/evaluate/{tuned.id}/base/")
    assert RolloutBatch.objects.filter(evaluates=job).count() == 2


def test_the_comparison_link_appears_when_a_base_batch_already_covers_the_seeds(
    viewer_client, chat_endpoint
):
    job = _job(seeds=(1,))
    # Same seeds but 256 steps: a different measure, not a baseline for a 5-step batch.
    _finished_base_batch(seeds=[0, 2, 3], steps=256)
    # Another model on the seeds: not the base model.
    _finished_base_batch(seeds=[0, 2, 3], steps=5, model="someone-else")
    tuned, created = evaluation_services.evaluation_batch_create(
        job=job, endpoint=chat_endpoint, count=3, steps=5, enqueue=False
    )
    assert created and tuned.seeds == [0, 2, 3]
    page = viewer_client.get(f"/training/{job.id}/").content.decode()
    assert "compare-link" not in page
    # A viewer may look but not start the base model's batch.
    assert 'data-action="evaluate-base"' not in page and "data-evaluate-form" not in page

    covering = _finished_base_batch(seeds=[0, 2, 3, 9], steps=5)
    link = f'href="/compare/?batches={covering.id},{tuned.id}"'
    assert link in viewer_client.get(f"/training/{job.id}/").content.decode()
    assert link in viewer_client.get(f"/rollouts/{tuned.id}/").content.decode()
    # The base button returns the covering batch instead of playing the seeds again.
    base, created = evaluation_services.baseline_batch_create(batch=tuned, enqueue=False)
    assert (base.id, created) == (covering.id, False)


def test_only_users_who_may_start_batches_may_evaluate(client, viewer, chat_endpoint):
    job = _job(seeds=(1,))
    tuned, _ = evaluation_services.evaluation_batch_create(
        job=job, endpoint=chat_endpoint, count=2, steps=5, enqueue=False
    )
    form = {"count": 2, "steps": 5, "endpoint": chat_endpoint.name}
    trainer = User.objects.create_user("trainer-only", password="trainer-pass-123")
    trainer.user_permissions.add(Permission.objects.get(codename="submit_job"))
    for user in (viewer, trainer):
        client.force_login(user)
        page = client.get(f"/training/{job.id}/").content.decode()
        assert 'id="evaluate-job"' not in page
        assert client.post(f"/training/{job.id}/evaluate/", form).status_code == 403
        assert client.post(f"/training/{job.id}/evaluate/{tuned.id}/base/").status_code == 403
    assert RolloutBatch.objects.filter(evaluates=job).count() == 1
    client.logout()
    response = client.post(f"/training/{job.id}/evaluate/", form)
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_evaluate_needs_the_csrf_token(editor, chat_endpoint):
    job = _job(seeds=(1,), status="running")
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(editor)
    form = {"count": 2, "steps": 5, "endpoint": chat_endpoint.name}
    assert browser.post(f"/training/{job.id}/evaluate/", form).status_code == 403
    browser.get(f"/training/{job.id}/")
    token = browser.cookies["csrftoken"].value
    # With the token the request reaches the view, which refuses a job with no model.
    response = browser.post(f"/training/{job.id}/evaluate/", {**form, "csrfmiddlewaretoken": token})
    assert response.status_code == 400
    assert f"training job {job.id} has no fine-tuned model to evaluate (running)" in (
        response.content.decode()
    )
    assert RolloutBatch.objects.filter(evaluates=job).count() == 0


def test_evaluate_refuses_a_model_the_endpoint_does_not_serve(editor_client, chat_endpoint):
    job = _job(seeds=(1,))
    chat_endpoint.allowed_models = [BASE]
    chat_endpoint.save()
    response = editor_client.post(
        f"/training/{job.id}/evaluate/",
        {"count": 2, "steps": 5, "endpoint": chat_endpoint.name},
    )
    assert response.status_code == 400
    assert f"{FINE_TUNED!r} is not allowed on endpoint" in html.unescape(response.content.decode())
    response = editor_client.post(
        f"/training/{job.id}/evaluate/", {"count": 0, "steps": 5, "endpoint": "nowhere"}
    )
    assert response.status_code == 400
    assert RolloutBatch.objects.filter(evaluates=job).count() == 0
