"""The episode viewer at 10,000 turns: a page bounded by an index, each turn from its view."""

from __future__ import annotations

import base64
import hashlib
import json

from django.urls import reverse

from rollouts.models import Turn
from rollouts.review.viewer import PAGE_TEXT_CHARS, episode_index
from rollouts.tests.helpers import seed_episode

TURNS = 10_000
# VLM-sized: ~1.5 KB of observation a turn, 15 MB for the episode, as a real 10,000-turn game.
OBSERVATION = "Observation of turn {i}. " + "grass tree water sand stone " * 50
MODEL_TEXT = "Turn {i}: I walk to the tree and collect wood."


def _turn_url(episode_id: int, index: int) -> str:
    return reverse("rollouts:episode_turn", args=[episode_id, index])


def test_it_keeps_a_10000_turn_episode_page_under_a_megabyte_and_reads_a_turn(
    viewer_client, django_assert_max_num_queries, db
):
    episode = seed_episode(turns=TURNS, observation=OBSERVATION, model_text=MODEL_TEXT)
    response = viewer_client.get(
        reverse("rollouts:episode_detail", args=[episode.id]), {"turn": "9876"}
    )
    assert response.status_code == 200
    body = response.content.decode()
    assert len(response.content) < 1_000_000, len(response.content)
    # No turn's text travels with the page, not even the one at the cursor.
    for late in (9876, 9999, 5000):
        assert f"Observation of turn {late}." not in body
        assert f"Turn {late}: I walk" not in body
    assert "<dt>Turns</dt><dd>10000</dd>" in body
    assert response.context["viewer_config"]["turnIndex"] == 9876
    # The first frame shown is the cursor's: sha256("9876") by construction.
    assert hashlib.sha256(b"9876").hexdigest() in body

    # Session, user, the turn (its frame and correction joined): none grows with the episode.
    with django_assert_max_num_queries(3):
        detail = viewer_client.get(_turn_url(episode.id, 9876))
    assert detail.status_code == 200
    assert detail["Content-Type"] == "application/json"
    turn = detail.json()
    assert turn["observation"] == "Observation of turn 9876. " + "grass tree water sand stone " * 50
    assert turn["model_text"] == "Turn 9876: I walk to the tree and collect wood."
    assert turn["id"] == Turn.objects.get(episode=episode, index=9876).id
    assert (turn["index"], turn["step"], turn["actions"]) == (9876, 9876, ["noop"])
    assert turn["frame"] == hashlib.sha256(b"9876").hexdigest()
    assert turn["seen"] == [{"step": 9876, "frame": hashlib.sha256(b"9876").hexdigest()}]
    assert turn["vitals"] == {"health": 6, "food": 6, "drink": 6, "energy": 6}
    assert viewer_client.get(_turn_url(episode.id, TURNS)).status_code == 404


def test_it_indexes_every_turn_in_columns(db):
    turns = 300
    episode = seed_episode(turns=turns, observation="o {i}", model_text="m {i}")
    Turn.objects.filter(episode=episode, index__in=[3, 298]).update(flagged=True)
    Turn.objects.filter(episode=episode, index=7).update(error="HTTP 429", error_kind="http_429")
    Turn.objects.filter(episode=episode, index=42).update(
        achievements_unlocked=["collect_wood"], reward=1.0
    )
    Turn.objects.filter(episode=episode, index=200).update(
        achievements_unlocked=["collect_wood", "place_table"], reward=-0.5
    )
    index = episode_index(episode_id=episode.id)
    columns = index.columns
    assert index.count == columns["count"] == turns
    assert columns["turn"] == list(range(turns))
    assert columns["step"] == list(range(turns))
    digests = base64.b64decode(columns["frames"])
    assert len(digests) == 32 * turns
    for i in (0, 1, 123, turns - 1):
        assert digests[32 * i : 32 * i + 32].hex() == hashlib.sha256(str(i).encode()).hexdigest()
    assert columns["flagged"] == [3, 298]
    assert columns["errors"] == [7]
    assert columns["unlocks"] == [42, 200]
    assert columns["reward"] == [[42, 1.0], [200, -0.5]]
    assert columns["vitals"]["health"] == "0123456789" * (turns // 10)
    # First unlock only, named after the turn that unlocked it.
    assert index.unlocked == [("collect_wood", 42, 42), ("place_table", 200, 200)]


def test_it_answers_404_for_a_turn_outside_the_episode(viewer_client, db):
    one = seed_episode(turns=5, observation="one {i}", model_text="one {i}")
    other = seed_episode(turns=3, observation="other {i}", model_text="other {i}")
    assert viewer_client.get(_turn_url(one.id, 4)).json()["model_text"] == "one 4"
    assert viewer_client.get(_turn_url(other.id, 2)).json()["model_text"] == "other 2"
    assert viewer_client.get(_turn_url(other.id, 3)).status_code == 404
    assert viewer_client.get(_turn_url(other.id, 4)).status_code == 404
    assert viewer_client.get(_turn_url(10**9, 0)).status_code == 404
    assert viewer_client.get(reverse("rollouts:episode_detail", args=[10**9])).status_code == 404


def test_it_gives_a_turn_to_the_signed_in_only_as_the_page_does(client, viewer, editor, db):
    episode = seed_episode(turns=5, observation="seen {i}", model_text="said {i}")
    page = reverse("rollouts:episode_detail", args=[episode.id])
    turn = _turn_url(episode.id, 4)
    for url in (page, turn):
        anonymous = client.get(url)
        assert anonymous.status_code == 302, url
        assert anonymous["Location"].startswith(reverse("login")), url
    answers = {}
    for user, can_review in ((viewer, False), (editor, True)):
        client.force_login(user)
        response = client.get(page)
        assert response.status_code == 200
        assert response.context["viewer_config"]["canReview"] is can_review
        assert ('id="flag-button"' in response.content.decode()) is can_review
        detail = client.get(turn)
        assert detail.status_code == 200
        answers[user.username] = detail.json()
        client.logout()
    # The same turn for both: what differs is what the page lets each do with it.
    assert answers["viewer"] == answers["editor"]
    assert (answers["viewer"]["observation"], answers["viewer"]["model_text"]) == (
        "seen 4",
        "said 4",
    )


def _page_reads_turn_rows(client, episode_id: int) -> tuple[dict, bool]:
    """The page's context, and whether answering it read the episode's turn rows (the one
    query that joins each turn's frame)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse("rollouts:episode_detail", args=[episode_id]))
    assert response.status_code == 200
    joins = [q["sql"] for q in queries if 'INNER JOIN "rollouts_frame"' in q["sql"]]
    return response.context, bool(joins)


def test_a_long_ended_episode_is_indexed_once_and_its_flags_stay_live(viewer_client, db):
    episode = seed_episode(turns=1_200, observation="o {i}", model_text="m {i}")
    first, read = _page_reads_turn_rows(viewer_client, episode.id)
    assert read and first["turn_flags"] == []
    # Recorded columns come from the cache now; a reviewer's flag is read anew.
    Turn.objects.filter(episode=episode, index__in=[5, 1_199]).update(flagged=True)
    again, read = _page_reads_turn_rows(viewer_client, episode.id)
    assert not read
    assert again["turn_flags"] == [5, 1_199]
    assert str(again["turn_index"]) == str(first["turn_index"])
    assert again["start_frame"] == hashlib.sha256(b"0").hexdigest()
    page = viewer_client.get(reverse("rollouts:episode_detail", args=[episode.id]))
    assert b'<script id="turn-flags" type="application/json">[5, 1199]</script>' in page.content


def test_an_episode_still_playing_is_indexed_afresh_every_time(viewer_client, db):
    from rollouts.models import Episode

    episode = seed_episode(turns=1_200, observation="o {i}", model_text="m {i}")
    Episode.objects.filter(id=episode.id).update(status=Episode.Status.RUNNING)
    _page_reads_turn_rows(viewer_client, episode.id)
    Turn.objects.filter(episode=episode, index=7).update(error="HTTP 429", error_kind="http_429")
    context, read = _page_reads_turn_rows(viewer_client, episode.id)
    assert read
    assert '"errors":[7]' in str(context["turn_index"])


def test_it_gives_tool_call_arguments_as_indented_json_or_as_sent_marked(viewer_client, db):
    episode = seed_episode(turns=3, observation="o {i}", model_text="m {i}")
    hostile = '{"actions": ["do"], "note": "<img src=x onerror=alert(1)>"'  # unclosed
    long = json.dumps({"actions": ["noop"], "pad": "x" * 3000})
    calls = {
        0: [_call("call_0", "interact_many", '{"actions":["move_left","do"]}')],
        1: [_call("call_1", "interact_many", hostile), _call("call_2", "interact_many", "NaN")],
        2: [_call("call_3", "interact_many", long)],
    }
    for index, turn_calls in calls.items():
        Turn.objects.filter(episode=episode, index=index).update(tool_calls=turn_calls)

    valid = viewer_client.get(_turn_url(episode.id, 0)).json()
    assert valid["calls"] == [
        {
            "id": "call_0",
            "name": "interact_many",
            "arguments": '{\n  "actions": [\n    "move_left",\n    "do"\n  ]\n}',
            "malformed": False,
        }
    ]
    # As recorded, beside what the viewer shows.
    assert valid["tool_calls"][0]["function"]["arguments"] == '{"actions":["move_left","do"]}'

    malformed = viewer_client.get(_turn_url(episode.id, 1)).json()["calls"]
    assert [(c["arguments"], c["malformed"]) for c in malformed] == [
        (hostile, True),
        ("NaN", True),
    ]

    cut = viewer_client.get(_turn_url(episode.id, 2)).json()
    pretty = json.dumps(json.loads(long), indent=2)
    assert cut["calls"][0]["arguments"] == pretty[:PAGE_TEXT_CHARS] + "…"
    assert cut["clipped"] == {"tool_calls": len(pretty)}
    whole = viewer_client.get(_turn_url(episode.id, 2), {"whole": "1"}).json()
    assert whole["calls"][0]["arguments"] == pretty and whole["clipped"] == {}


def _call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
