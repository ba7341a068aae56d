"""Play, fork and relabel pages with personas: viewer (looks), editor (plays, forks, relabels),
another editor (not the player of someone else's game), anonymous; and CSRF on each action."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from rollouts.models import Episode, RolloutBatch, Turn, TurnRelabel
from rollouts.play import services as services_play
from rollouts.tests.helpers import record_batch

pytestmark = pytest.mark.django_db


@pytest.fixture
def scripted(db) -> Episode:
    return record_batch(policy="scripted", seeds=(2,), steps=12).episodes.get()


@pytest.fixture
def game(editor) -> Episode:
    settings = services_play.play_settings(seed=4, steps=100, image_size=64)
    return services_play.play_start(settings=settings, user=editor)


@pytest.fixture
def other_editor(db) -> User:
    user = User.objects.create_user("other", password="other-pass-123")
    user.user_permissions.add(Permission.objects.get(codename="review_turn"))
    return user


def _step(client: Client, episode: Episode, action: str, turn: int):
    return client.post(
        reverse("rollouts:play_step", args=[episode.id]), {"action": action, "turn": turn}
    )


def test_it_starts_a_game_and_plays_keys_as_json(editor_client):
    page = editor_client.get(reverse("rollouts:play_new"))
    assert page.status_code == 200
    response = editor_client.post(
        reverse("rollouts:play_new"), {"seed": 9, "steps": 50, "image_size": 64}
    )
    episode = Episode.objects.get(batch__policy=RolloutBatch.Policy.HUMAN)
    assert response.status_code == 302
    assert response["Location"] == reverse("rollouts:play", args=[episode.id])
    page = editor_client.get(response["Location"])
    assert page.status_code == 200
    assert b"move_up" in page.content and b"play-config" in page.content
    first = _step(editor_client, episode, "move_left", 0)
    assert first.status_code == 200
    data = first.json()
    assert (data["turns"], data["step"], data["duplicate"]) == (1, 1, False)
    assert set(data["state"]["vitals"]) == {"health", "food", "drink", "energy"}
    again = _step(editor_client, episode, "move_left", 0).json()
    assert again["duplicate"] and again["turns"] == 1
    bad = _step(editor_client, episode, "<b>fly</b>", 1)
    assert bad.status_code == 409 and "not one of" in bad.json()["error"]
    end = editor_client.post(reverse("rollouts:play_end", args=[episode.id]))
    assert end.status_code == 302
    episode.refresh_from_db()
    assert episode.status == Episode.Status.FINISHED


def test_it_refuses_bad_game_options_on_the_form(editor_client):
    response = editor_client.post(
        reverse("rollouts:play_new"), {"seed": -1, "steps": 0, "image_size": 7}
    )
    assert response.status_code == 200
    assert not RolloutBatch.objects.exists()


def test_a_viewer_looks_at_a_game_but_cannot_play_fork_or_relabel(client, viewer, game, scripted):
    client.force_login(viewer)
    assert client.get(reverse("rollouts:play", args=[game.id])).status_code == 200
    assert client.get(reverse("rollouts:play_new")).status_code == 403
    assert client.post(reverse("rollouts:play_new"), {"seed": 1, "steps": 9}).status_code == 403
    assert _step(client, game, "noop", 0).status_code == 403
    assert client.post(reverse("rollouts:play_end", args=[game.id])).status_code == 403
    fork = client.post(
        reverse("rollouts:episode_fork", args=[scripted.id]), {"turn": 3, "policy": "random"}
    )
    assert fork.status_code == 403
    turn = scripted.turns.get(index=3)
    relabel = client.post(reverse("rollouts:turn_relabel", args=[turn.id]), {"actions": "do"})
    assert relabel.status_code == 403
    assert game.turns.count() == 0
    assert Episode.objects.count() == 2 and not TurnRelabel.objects.exists()


def test_another_editor_cannot_play_someone_elses_game(client, other_editor, game):
    client.force_login(other_editor)
    response = _step(client, game, "noop", 0)
    assert response.status_code == 403 and "fork it" in response.json()["error"]
    assert game.turns.count() == 0


def test_a_superuser_may_play_any_game(client, admin_user, game):
    client.force_login(admin_user)
    assert _step(client, game, "noop", 0).status_code == 200


def test_anonymous_visitors_go_to_the_login_page(client, game, scripted):
    turn = scripted.turns.first()
    for method, url in [
        ("get", reverse("rollouts:play_new")),
        ("get", reverse("rollouts:play", args=[game.id])),
        ("post", reverse("rollouts:play_step", args=[game.id])),
        ("post", reverse("rollouts:episode_fork", args=[scripted.id])),
        ("post", reverse("rollouts:turn_relabel", args=[turn.id])),
    ]:
        response = getattr(client, method)(url)
        assert response.status_code == 302 and response["Location"].startswith("/login/"), url


def test_every_action_needs_the_csrf_token(editor, game, scripted):
    client = Client(enforce_csrf_checks=True)
    client.force_login(editor)
    turn = scripted.turns.get(index=2)
    for url, data in [
        (reverse("rollouts:play_new"), {"seed": 1, "steps": 9, "image_size": 64}),
        (reverse("rollouts:play_step", args=[game.id]), {"action": "noop", "turn": 0}),
        (reverse("rollouts:play_end", args=[game.id]), {}),
        (reverse("rollouts:episode_fork", args=[scripted.id]), {"turn": 2, "policy": "random"}),
        (reverse("rollouts:turn_relabel", args=[turn.id]), {"actions": "do"}),
    ]:
        assert client.post(url, data).status_code == 403, url
    assert game.turns.count() == 0 and Episode.objects.count() == 2
    assert not TurnRelabel.objects.exists()


def test_an_editor_relabels_changes_and_removes_a_correction(editor_client, editor, scripted):
    turn = scripted.turns.get(index=4)
    url = reverse("rollouts:turn_relabel", args=[turn.id])
    saved = editor_client.post(url, {"actions": "place_table do", "reason": "<i>table</i>"})
    assert saved.status_code == 200
    assert saved.json()["relabel"]["actions"] == ["place_table", "do"]
    assert saved.json()["relabel"]["by"] == "editor"
    relabel = TurnRelabel.objects.get(turn=turn)
    assert relabel.labeled_by == editor and relabel.reason == "<i>table</i>"
    turn.refresh_from_db()
    assert turn.actions == ["do"]  # the original is kept
    for bad in ("", "do " * 9, "teleport"):
        assert editor_client.post(url, {"actions": bad}).status_code == 400
    assert editor_client.post(url, {"actions": "noop"}).json()["relabel"]["actions"] == ["noop"]
    assert TurnRelabel.objects.count() == 1
    assert editor_client.post(url, {"remove": "1"}).json()["relabel"] is None
    assert not TurnRelabel.objects.exists()


def test_the_viewer_shows_the_correction_and_links_forks_both_ways(editor_client, editor, scripted):
    turn = scripted.turns.get(index=5)
    editor_client.post(
        reverse("rollouts:turn_relabel", args=[turn.id]), {"actions": "sleep", "reason": "tired"}
    )
    response = editor_client.post(
        reverse("rollouts:episode_fork", args=[scripted.id]),
        {"turn": 5, "policy": "human", "with_correction": "1"},
    )
    fork = Episode.objects.get(forked_from=scripted)
    assert response["Location"] == reverse("rollouts:play", args=[fork.id])
    assert fork.fork_with_correction and fork.turns.count() == 6
    assert Turn.objects.get(episode=fork, index=5).actions == ["sleep"]
    original_page = editor_client.get(reverse("rollouts:episode_detail", args=[scripted.id]))
    assert f'href="/episodes/{fork.id}/"'.encode() in original_page.content
    turn_five = editor_client.get(reverse("rollouts:episode_turn", args=[scripted.id, 5]))
    assert turn_five.json()["relabel"]["reason"] == "tired"
    fork_page = editor_client.get(reverse("rollouts:episode_detail", args=[fork.id]))
    assert f'href="/episodes/{scripted.id}/?turn=5"'.encode() in fork_page.content


def test_a_fork_that_cannot_be_made_says_why(editor_client, scripted):
    response = editor_client.post(
        reverse("rollouts:episode_fork", args=[scripted.id]),
        {"turn": 99, "policy": "random"},
        follow=True,
    )
    assert b"Fork not made: turn: episode" in response.content
    assert not Episode.objects.filter(forked_from=scripted).exists()


def test_the_achievement_chip_names_and_links_the_turn_that_unlocked_it(editor_client):
    episode = record_batch(policy="scripted", seeds=(0,), steps=256).episodes.get()
    name, step = min(episode.achievements.items(), key=lambda kv: kv[1])
    # One action per turn: the turn that unlocked it played the step before.
    turn = Turn.objects.get(episode=episode, achievements_unlocked__contains=[name])
    assert turn.index == step - 1
    page = editor_client.get(reverse("rollouts:episode_detail", args=[episode.id])).content
    assert f'href="?turn={turn.index}" data-turn="{turn.index}"'.encode() in page
    assert f"{name} <small>turn {turn.index}</small>".encode() in page


def test_a_fork_played_by_a_model_uses_a_named_endpoint_never_a_typed_url(
    editor_client, scripted, chat_server, chat_endpoint
):
    from rollouts.recording import services
    from rollouts.tests import openai_server as replies

    url = reverse("rollouts:episode_fork", args=[scripted.id])
    typed = editor_client.post(
        url,
        {"turn": 4, "policy": "openai", "model": "test-vlm", "base_url": "http://evil.invalid"},
        follow=True,
    )
    assert b"Fork not made: endpoint: choose one of the endpoints" in typed.content
    assert not Episode.objects.filter(forked_from=scripted).exists()
    chat_server.script(*[replies.tool_call("do")] * 12)
    made = editor_client.post(
        url, {"turn": 4, "policy": "openai", "model": "test-vlm", "endpoint": "local-test"}
    )
    fork = Episode.objects.get(forked_from=scripted)
    # The fork opens at the turn it was made at; until a worker records it, the page waits.
    at_fork = reverse("rollouts:episode_detail", args=[fork.id]) + "?turn=4"
    assert made["Location"] == at_fork
    assert (fork.batch.policy, fork.batch.endpoint) == ("openai", chat_server.url)
    assert fork.batch.settings["endpoint"] == "local-test"
    waiting = editor_client.get(at_fork).content.decode()
    assert 'id="episode-waiting"' in waiting and 'id="viewer"' not in waiting
    assert f'hx-get="{at_fork}"' in waiting
    assert "Replaying episode" in waiting and "Reload in a moment" not in waiting
    poll = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TRIGGER": "episode-waiting"}
    again = editor_client.get(at_fork, **poll)
    assert again.status_code == 200 and "HX-Refresh" not in again
    assert b'id="episode-waiting"' in again.content and b"<html" not in again.content
    assert services.episode_run(episode_id=fork.id) == "finished"
    # Its turns are recorded: the next poll has the browser load the viewer at turn 4.
    done = editor_client.get(at_fork, **poll)
    assert done.status_code == 200 and done["HX-Refresh"] == "true"
    viewer = editor_client.get(at_fork)
    assert viewer.context["viewer_config"]["turnIndex"] == 4
    assert b'id="episode-waiting"' not in viewer.content
    assert [t.actions for t in fork.turns.order_by("index")][4:] == [["do"]] * 8
    # The model saw the fork's own turns only: the replayed ones asked it nothing.
    assert len(chat_server.requests) == 8


def test_an_ended_game_has_no_end_button_and_its_page_is_never_kept(editor_client, game):
    url = reverse("rollouts:play", args=[game.id])
    running = editor_client.get(url)
    assert b'id="end-game"' in running.content
    # Back from the viewer asks again rather than showing the running game the browser kept.
    assert "no-store" in running["Cache-Control"]
    services_play.play_end(episode_id=game.id)
    assert b'id="end-game"' not in editor_client.get(url).content
