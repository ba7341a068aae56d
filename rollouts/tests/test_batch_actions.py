"""Resume, cancel and run again: the services, the pages, the batch form's options."""

from __future__ import annotations

import pytest
from django.urls import reverse

from rollouts.models import Episode, RolloutBatch
from rollouts.recording import services
from rollouts.rollout_settings import RolloutSettings
from studio.models import Endpoint

pytestmark = pytest.mark.django_db


def _pending_batch(**kwargs) -> RolloutBatch:
    kwargs.setdefault("policy", "scripted")
    kwargs.setdefault("seeds", (0, 1, 2))
    kwargs.setdefault("steps", 5)
    return services.batch_create(settings=RolloutSettings(**kwargs), enqueue=False)


def test_it_cancels_a_running_batch_and_its_running_episodes_end_as_canceled():
    batch = _pending_batch()
    running = batch.episodes.get(seed=0)
    token = services.episode_claim(episode_id=running.id)
    assert services.batch_cancel(batch=batch) == 3
    batch.refresh_from_db()
    assert (batch.status, batch.episodes_failed, batch.episodes_finished) == ("canceled", 3, 0)
    assert set(batch.episodes.values_list("status", "error")) == {("canceled", "canceled")}
    # A delivered task finds nothing to do; the worker that held a claim cannot finish it.
    assert services.episode_run(episode_id=batch.episodes.get(seed=1).id) == "done_already"
    services.episode_finish(episode=running, claim_token=token, totals=_no_totals())
    assert Episode.objects.get(id=running.id).status == "canceled"
    assert services.batch_cancel(batch=batch) == 0  # only once


def _no_totals():
    from rollouts.recording.recorder import EpisodeTotals

    return EpisodeTotals()


def test_it_resumes_failed_and_canceled_episodes_from_the_start():
    batch = _pending_batch()
    assert services.episode_run(episode_id=batch.episodes.get(seed=0).id) == "finished"
    services.batch_cancel(batch=batch)
    batch.refresh_from_db()
    assert (batch.episodes_finished, batch.episodes_failed) == (1, 2)
    assert services.batch_resume(batch=batch, enqueue=False) == 2
    assert (batch.status, batch.episodes_failed, batch.error) == ("running", 0, "")
    services.batch_play_inline(batch=batch)  # `rollout --resume N --inline`
    assert (batch.status, batch.episodes_finished, batch.episodes_failed) == ("finished", 3, 0)
    assert batch.episodes.get(seed=1).turns.count() == 5
    assert services.batch_resume(batch=batch, enqueue=False) == 0


def test_a_canceled_claim_holder_writes_what_it_played_and_stops_at_its_next_chunk(settings):
    from rollouts.policies import build_policy
    from rollouts.recording.recorder import EpisodeCanceled, EpisodeRecorder

    settings.STUDIO_RECORD_CHUNK = 16
    batch = _pending_batch(seeds=(4,), steps=200)
    episode = batch.episodes.get()
    token = services.episode_claim(episode_id=episode.id)
    services.batch_cancel(batch=batch)
    settings = services.batch_settings(batch)
    recorder = EpisodeRecorder(
        episode=Episode.objects.get(id=episode.id),
        settings=settings,
        policy=build_policy(settings, seed=4),
        claim_token=token,
    )
    with pytest.raises(EpisodeCanceled):
        recorder.play()
    # The chunk that found the cancel is written (16 turns), and nothing after it.
    assert Episode.objects.get(id=episode.id).turns.count() == 16


def test_it_offers_resume_cancel_and_run_again_to_editors_only(editor, viewer):
    from django.test import Client

    editor_client, viewer_client = Client(), Client()
    editor_client.force_login(editor)
    viewer_client.force_login(viewer)
    batch = _pending_batch()
    services.episode_claim(episode_id=batch.episodes.get(seed=0).id)
    url = reverse("rollouts:batch_detail", args=[batch.id])
    page = editor_client.get(url).content.decode()
    assert 'data-action="cancel"' in page and 'data-action="run-again"' in page
    # Running: its episodes are being played, nothing has failed; Resume is not offered.
    assert 'data-action="resume"' not in page
    looker = viewer_client.get(url).content.decode()
    assert "data-action" not in looker
    cancel = reverse("rollouts:batch_cancel", args=[batch.id])
    assert viewer_client.post(cancel).status_code == 403
    assert editor_client.post(cancel).status_code == 302
    page = editor_client.get(url).content.decode()
    assert 'data-action="cancel"' not in page and "Resume (3)" in page
    resume = reverse("rollouts:batch_resume", args=[batch.id])
    assert viewer_client.post(resume).status_code == 403
    response = editor_client.post(resume, follow=True)
    assert "Resumed: 3 unfinished episodes queued." in response.content.decode()


def test_it_shows_a_failed_batch_as_failed():
    batch = _pending_batch()
    services.batch_fail(batch=batch, error="endpoint down")
    batch.refresh_from_db()
    assert batch.failed_percent == 100.0 and batch.finished_percent == 0


def test_it_shows_a_failed_batch_page_with_a_dash_for_the_score(editor_client):
    batch = _pending_batch()
    services.batch_fail(batch=batch, error="endpoint down")
    page = editor_client.get(reverse("rollouts:batch_detail", args=[batch.id])).content.decode()
    assert '<span class="stat-value" data-score>—</span>' in page
    assert 'class="failed" style="width: 100.0%"' in page
    assert "3 failed" in page


def test_it_prefills_run_again_with_the_batchs_settings(editor_client):
    batch = _pending_batch(
        policy="openai",
        model="m-1",
        base_url="http://127.0.0.1:9/v1",
        seeds=(0, 1, 2, 3, 7),
        temperature=0.7,
        max_tokens=300,
        observation_mode="text",
        on_bad_output="end",
        requests_per_minute=60,
    )
    response = editor_client.get(reverse("rollouts:batch_create"), {"from": batch.id})
    form = response.context["form"]
    assert form.initial["seeds"] == "0-3,7"
    assert (form.initial["model"], form.initial["temperature"]) == ("m-1", 0.7)
    assert form.initial["observation_mode"] == "text" and form.initial["on_bad_output"] == "end"
    assert form.initial["requests_per_minute"] == 60 and form.initial["max_tokens"] == 300
    assert 'value="0-3,7"' in response.content.decode()


def test_it_shows_the_settings_that_apply_as_a_table(editor_client):
    batch = _pending_batch(actions=("do", "noop"))
    page = editor_client.get(reverse("rollouts:batch_detail", args=[batch.id])).content.decode()
    assert '<th scope="row">Actions</th><td>do noop</td>' in page
    assert "Temperature" not in page and "{&quot;" not in page


def test_it_lists_every_form_error_at_once_in_page_words(editor_client):
    response = editor_client.post(
        reverse("rollouts:batch_create"),
        {
            "policy": "openai",
            "seeds": "0-2",
            "steps": "20000",
            "image_size": "64",
            "temperature": "5",
            "max_retries": "99",
        },
    )
    assert response.status_code == 200
    errors = response.context["form"].errors
    # No endpoint named yet: that is one more problem, shown with the others.
    assert set(errors) == {"model", "endpoint", "steps", "temperature", "max_retries"}
    assert errors["model"] == ["The openai policy needs a model name."]
    assert all("--" not in e for messages in errors.values() for e in messages)
    assert not RolloutBatch.objects.exists()


def test_it_starts_an_openai_batch_with_every_option_from_the_form(editor_client):
    Endpoint.objects.create(name="vlm-server", base_url="http://127.0.0.1:9/v1")
    response = editor_client.post(
        reverse("rollouts:batch_create"),
        {
            "policy": "openai",
            "model": "vlm-x",
            "endpoint": "vlm-server",
            "seeds": "1",
            "steps": "10",
            "image_size": "64",
            "observation_mode": "image",
            "history_frames": "2",
            "image_detail": "low",
            "temperature": "0.5",
            "max_tokens": "128",
            "on_bad_output": "end",
            "max_retries": "2",
            "request_timeout": "15",
            "concurrency": "8",
            "requests_per_minute": "30",
        },
    )
    assert response.status_code == 302
    settings = RolloutBatch.objects.get().settings
    assert {k: settings[k] for k in ("observation_mode", "image_detail", "on_bad_output")} == {
        "observation_mode": "image",
        "image_detail": "low",
        "on_bad_output": "end",
    }
    assert (settings["temperature"], settings["max_tokens"], settings["max_retries"]) == (
        0.5,
        128,
        2,
    )
    assert (settings["request_timeout"], settings["concurrency"]) == (15.0, 8)
    assert (settings["requests_per_minute"], settings["history_frames"]) == (30, 2)
    assert (settings["endpoint"], settings["base_url"]) == ("vlm-server", "http://127.0.0.1:9/v1")


def test_it_offers_resume_only_once_the_batch_has_ended_with_that_many_to_play(editor_client):
    batch = _pending_batch()
    url = reverse("rollouts:batch_detail", args=[batch.id])
    assert 'data-action="resume"' not in editor_client.get(url).content.decode()  # pending
    services.episode_claim(episode_id=batch.episodes.get(seed=0).id)
    assert services.episode_run(episode_id=batch.episodes.get(seed=1).id) == "finished"
    batch.refresh_from_db()
    assert batch.status == "running"
    assert 'data-action="resume"' not in editor_client.get(url).content.decode()
    services.batch_cancel(batch=batch)
    assert "Resume (2)" in editor_client.get(url).content.decode()
    services.batch_resume(batch=batch, enqueue=False)
    services.batch_play_inline(batch=batch)
    batch.refresh_from_db()
    assert batch.status == "finished"
    assert 'data-action="resume"' not in editor_client.get(url).content.decode()


def test_it_offers_no_resume_on_a_persons_game(editor_client, editor):
    from rollouts.play import services as services_play

    settings = services_play.play_settings(seed=3, steps=50, image_size=64)
    episode = services_play.play_start(settings=settings, user=editor)
    services.batch_cancel(batch=episode.batch)
    page = editor_client.get(reverse("rollouts:batch_detail", args=[episode.batch_id]))
    assert 'data-action="resume"' not in page.content.decode()


def test_a_game_left_open_stops_counting_as_running(editor_client, editor, settings):
    from rollouts.play import services as services_play
    from studio.testing import backdate

    settings.STUDIO_HUMAN_IDLE_SECONDS = 600
    game = services_play.play_start(
        settings=services_play.play_settings(seed=3, steps=50, image_size=64), user=editor
    )
    listing = reverse("rollouts:batch_list")
    detail = reverse("rollouts:batch_detail", args=[game.batch_id])
    assert editor_client.get(listing).context["poll"] is True
    assert editor_client.get(detail).context["active"] is True
    services_play.play_step(episode_id=game.id, action="noop", turn=0)
    backdate(game.batch, field="created_at", seconds=3600)
    # Created long ago, but a key was pressed a moment ago: still being played.
    assert editor_client.get(listing).context["poll"] is True
    backdate(game, field="heartbeat_at", seconds=601)
    response = editor_client.get(listing)
    assert response.context["poll"] is False
    assert "hx-trigger" not in response.content.decode()
    assert '<span class="badge status-idle"' in response.content.decode()
    page = editor_client.get(detail)
    assert page.context["active"] is False and page.context["idle"] is True
    assert "hx-trigger" not in page.content.decode()
    assert '<span class="badge status-idle"' in page.content.decode()
    # A model's batch running beside it still refreshes the list.
    _pending_batch()
    assert editor_client.get(listing).context["poll"] is True
