"""Long model texts: the episode page carries their start, a small view the rest."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from rollouts.models import Episode
from rollouts.review.viewer import PAGE_TEXT_CHARS
from rollouts.tests import openai_server as replies
from rollouts.tests.helpers import record_batch

LONG_TEXT = "`do` " + "z" * 59_995  # 60,000 characters: under the storage cap, over the page's


@pytest.fixture
def long_episode(db, chat_server) -> Episode:
    long_call = replies.tool_call("do")
    long_call.tool_calls = [("interact_many", json.dumps({"actions": ["do"], "pad": "x" * 9000}))]
    chat_server.script(replies.text(LONG_TEXT, reasoning="r" * 5000), long_call)
    batch = record_batch(
        policy="openai", model="test-vlm", base_url=chat_server.url, seeds=(1,), steps=2
    )
    return batch.episodes.get()


def _turn(client, episode: Episode, index: int) -> dict:
    return client.get(reverse("rollouts:episode_turn", args=[episode.id, index])).json()


def test_it_sends_the_viewer_the_start_of_long_texts(viewer_client, long_episode):
    response = viewer_client.get(reverse("rollouts:episode_detail", args=[long_episode.id]))
    assert response.status_code == 200
    assert len(response.content) < 60_000
    first, second = _turn(viewer_client, long_episode, 0), _turn(viewer_client, long_episode, 1)
    assert first["model_text"] == LONG_TEXT[:PAGE_TEXT_CHARS] + "…"
    assert first["clipped"] == {"model_text": 60_000, "reasoning": 5000}
    assert second["clipped"].keys() == {"tool_calls"}
    assert len(second["tool_calls"][0]["function"]["arguments"]) == PAGE_TEXT_CHARS + 1
    assert first["truncated"] == {} and second["error"] == ""


def test_it_returns_a_turns_full_text_on_request(viewer_client, client, long_episode):
    first, second = long_episode.turns.order_by("index")
    text_url = reverse("rollouts:turn_text", args=[first.id, "model_text"])
    response = viewer_client.get(text_url)
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response.content.decode() == LONG_TEXT
    calls = viewer_client.get(reverse("rollouts:turn_text", args=[second.id, "tool_calls"]))
    assert json.loads(calls.content)[0]["function"]["arguments"] == json.dumps(
        {"actions": ["do"], "pad": "x" * 9000}
    )
    assert (
        viewer_client.get(reverse("rollouts:turn_text", args=[first.id, "note"])).status_code == 404
    )
    assert (
        viewer_client.get(reverse("rollouts:turn_text", args=[99999, "error"])).status_code == 404
    )
    client.logout()
    assert client.get(text_url).status_code == 302  # login first
