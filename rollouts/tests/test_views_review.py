"""Review pages with personas: anonymous, viewer (looks), editor (flags, notes, starts batches)."""

from __future__ import annotations

import json
import re

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from rollouts.models import Episode, RolloutBatch, Turn, TurnBulkFlag
from rollouts.recording import services
from rollouts.rollout_settings import RolloutSettings
from rollouts.tests.helpers import BATCH_ENDS
from studio.testing import JOB_ENDS, wait_for_row

HOSTILE = "<script>alert(1)</script>"


def _played(steps: int, seeds: tuple[int, ...] = (1,)) -> list[Episode]:
    batch = services.batch_run_inline(
        settings=RolloutSettings(policy="scripted", seeds=seeds, steps=steps)
    )
    assert batch.episodes_finished == len(seeds), batch.error
    return list(batch.episodes.order_by("seed"))


@pytest.fixture
def episode(db) -> Episode:
    return _played(6)[0]


def _pages(episode: Episode) -> list[str]:
    return [
        reverse("rollouts:batch_list"),
        reverse("rollouts:batch_detail", args=[episode.batch_id]),
        reverse("rollouts:episode_detail", args=[episode.id]),
        reverse("rollouts:turn_list"),
        reverse("rollouts:frame_image", args=[episode.frames.first().sha256]),
    ]


# --- anonymous -------------------------------------------------------------------------


def test_it_sends_anonymous_visitors_to_the_login_page(client, episode):
    turn = episode.turns.first()
    urls = [*_pages(episode), reverse("rollouts:batch_create")]
    for url in urls:
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(reverse("login")), url
    for url in (
        reverse("rollouts:turn_flag", args=[turn.id]),
        reverse("rollouts:turn_note", args=[turn.id]),
        reverse("rollouts:turns_bulk_flag"),
        reverse("rollouts:batch_create"),
    ):
        response = client.post(url, {"flagged": "1", "note": "x", "set_flagged": "1"})
        assert response.status_code == 302, url
    assert not Turn.objects.filter(flagged=True).exists()
    assert not Turn.objects.exclude(note="").exists()
    assert RolloutBatch.objects.count() == 1
    assert client.get(reverse("login")).status_code == 200


def test_it_logs_a_user_in_through_the_form(client, viewer, episode):
    response = client.post(
        reverse("login"),
        {"username": "viewer", "password": "viewer-pass-123", "next": "/turns/"},
    )
    assert response.status_code == 302
    assert response["Location"] == "/turns/"
    assert client.get("/turns/").status_code == 200


# --- viewer ------------------------------------------------------------------------------


def test_it_shows_every_page_to_a_viewer(viewer_client, episode):
    for url in _pages(episode):
        assert viewer_client.get(url).status_code == 200, url


def test_it_refuses_a_viewer_every_write(viewer_client, episode):
    turn = episode.turns.get(index=1)
    assert viewer_client.get(reverse("rollouts:batch_create")).status_code == 403
    response = viewer_client.post(
        reverse("rollouts:batch_create"), {"policy": "scripted", "seeds": "1", "steps": 3}
    )
    assert response.status_code == 403
    flag = viewer_client.post(
        reverse("rollouts:turn_flag", args=[turn.id]), {"flagged": "1"}, HTTP_HX_REQUEST="true"
    )
    assert flag.status_code == 403
    note = viewer_client.post(reverse("rollouts:turn_note", args=[turn.id]), {"note": "mine"})
    assert note.status_code == 403
    bulk_get = viewer_client.get(reverse("rollouts:turns_bulk_flag"), {"set_flagged": "1"})
    assert bulk_get.status_code == 403
    bulk = viewer_client.post(reverse("rollouts:turns_bulk_flag"), {"set_flagged": "1"})
    assert bulk.status_code == 403
    turn.refresh_from_db()
    assert (turn.flagged, turn.note) == (False, "")
    assert not Turn.objects.filter(flagged=True).exists()
    assert RolloutBatch.objects.count() == 1


def test_it_shows_a_viewer_the_episode_without_review_controls(viewer_client, episode):
    response = viewer_client.get(reverse("rollouts:episode_detail", args=[episode.id]))
    body = response.content.decode()
    assert 'id="flag-button"' not in body
    assert "need the review permission" in body
    assert response.context["viewer_config"]["canReview"] is False


# --- editor ------------------------------------------------------------------------------


def test_it_flags_and_unflags_a_turn_over_htmx(editor_client, editor, episode):
    turn = episode.turns.get(index=1)
    url = reverse("rollouts:turn_flag", args=[turn.id])
    response = editor_client.post(url, {"flagged": "1"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert json.loads(response["HX-Trigger"]) == {
        "studio:turn-reviewed": {"id": turn.id, "flagged": True, "note_length": 0}
    }
    # The button now offers to unflag (the template's "flagged" in hx-vals is always there).
    assert 'aria-pressed="true"' in response.content.decode()
    turn.refresh_from_db()
    assert turn.flagged is True
    assert turn.reviewed_by == editor
    response = editor_client.post(url, {"flagged": "0"}, HTTP_HX_REQUEST="true")
    assert 'aria-pressed="false"' in response.content.decode()
    turn.refresh_from_db()
    assert turn.flagged is False
    assert editor_client.post(url, {"flagged": "maybe"}).status_code == 400


def test_it_saves_a_note_and_redirects_plain_forms_back_to_the_turn(editor_client, episode):
    turn = episode.turns.get(index=2)
    url = reverse("rollouts:turn_note", args=[turn.id])
    response = editor_client.post(url, {"note": "  stuck on a tree  "}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert "Note saved (15 characters)." in response.content.decode()
    turn.refresh_from_db()
    assert turn.note == "stuck on a tree"
    response = editor_client.post(url, {"note": "plain form", "next": "https://evil.example/"})
    assert response.status_code == 302
    assert response["Location"] == (
        reverse("rollouts:episode_detail", args=[episode.id]) + f"?turn={turn.index}"
    )
    too_long = editor_client.post(url, {"note": "x" * 10_001})
    assert too_long.status_code == 400
    turn.refresh_from_db()
    assert turn.note == "plain form"
    missing = editor_client.post(reverse("rollouts:turn_flag", args=[10**9]), {"flagged": "1"})
    assert missing.status_code == 404


def test_it_lets_the_admin_flag_without_the_explicit_permission(client, admin_user, episode):
    client.force_login(admin_user)
    turn = episode.turns.get(index=0)
    response = client.post(
        reverse("rollouts:turn_flag", args=[turn.id]), {"flagged": "1"}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200
    turn.refresh_from_db()
    assert turn.flagged is True
    assert client.get(reverse("rollouts:batch_create")).status_code == 200


def test_it_starts_no_batch_from_an_invalid_form_and_names_the_field(editor_client, db):
    url = reverse("rollouts:batch_create")
    cases = [
        ({"policy": "scripted", "seeds": "1-x", "steps": 5}, "seeds"),
        ({"policy": "scripted", "seeds": "5-2", "steps": 5}, "seeds"),
        ({"policy": "openai", "seeds": "1", "steps": 5}, "model"),
        ({"policy": "scripted", "seeds": "1", "steps": 20_000}, "steps"),
        ({"policy": "scripted", "seeds": "1", "steps": 5, "image_size": 4000}, "image_size"),
        ({"policy": "scripted", "seeds": "1", "steps": 5, "history_frames": 12}, "history_frames"),
        ({"policy": "scripted", "seeds": "1", "steps": 5, "actions": "dance"}, "actions"),
        ({"policy": "chess", "seeds": "1", "steps": 5}, "policy"),
    ]
    for data, field in cases:
        values = {"image_size": 64, "history_frames": 0, "concurrency": 4, **data}
        response = editor_client.post(url, values)
        assert response.status_code == 200, data
        assert field in response.context["form"].errors, (data, response.context["form"].errors)
    assert RolloutBatch.objects.count() == 0


def test_it_creates_a_batch_from_the_form_and_redirects(editor_client, editor, db):
    response = editor_client.post(
        reverse("rollouts:batch_create"),
        {
            "name": "form batch",
            "policy": "scripted",
            "seeds": "3,5-6",
            "steps": 12,
            "image_size": 48,
            "history_frames": 0,
            "concurrency": 2,
            "actions": "move_left do",
        },
    )
    batch = RolloutBatch.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("rollouts:batch_detail", args=[batch.id])
    assert batch.seeds == [3, 5, 6]
    assert (batch.step_limit, batch.image_size, batch.created_by) == (12, 48, editor)
    assert batch.settings["actions"] == ["move_left", "do"]
    assert batch.settings["concurrency"] == 2
    assert batch.episodes.count() == 3


@pytest.mark.django_db(transaction=True)
def test_it_runs_a_batch_started_in_the_browser_on_the_worker(client, celery_worker):
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user("runner", password="runner-pass-123")
    user.user_permissions.add(Permission.objects.get(codename="review_turn"))
    client.force_login(user)
    response = client.post(
        reverse("rollouts:batch_create"),
        {
            "policy": "scripted",
            "seeds": "0-1",
            "steps": 6,
            "image_size": 64,
            "history_frames": 0,
            "concurrency": 2,
        },
    )
    assert response.status_code == 302
    batch = wait_for_row(RolloutBatch.objects.get(), statuses=BATCH_ENDS, timeout=120)
    assert batch.status == RolloutBatch.Status.FINISHED
    assert batch.episodes_finished == 2
    assert Turn.objects.filter(episode__batch=batch).count() == 12


# --- CSRF --------------------------------------------------------------------------------


def test_it_enforces_csrf_on_flags_notes_bulk_and_batches(editor, episode):
    csrf_client = Client(enforce_csrf_checks=True)
    csrf_client.force_login(editor)
    turn = episode.turns.get(index=1)
    flag_url = reverse("rollouts:turn_flag", args=[turn.id])
    posts = [
        (flag_url, {"flagged": "1"}),
        (reverse("rollouts:turn_note", args=[turn.id]), {"note": "forged"}),
        (reverse("rollouts:turns_bulk_flag"), {"set_flagged": "1"}),
        (reverse("rollouts:batch_create"), {"policy": "scripted", "seeds": "1", "steps": 3}),
    ]
    for url, data in posts:
        assert csrf_client.post(url, data, HTTP_HX_REQUEST="true").status_code == 403, url
    turn.refresh_from_db()
    assert (turn.flagged, turn.note) == (False, "")
    assert RolloutBatch.objects.count() == 1

    # The page hands the token to htmx through <body hx-headers>; with it the flag is stored.
    page = csrf_client.get(reverse("rollouts:episode_detail", args=[episode.id]))
    # The token htmx sends is the one in the page, not the cookie's: a page that rendered an
    # empty or wrong token would fail here.
    headers = re.search(r"<body hx-headers='([^']*)'", page.content.decode())
    token = json.loads(headers.group(1))["X-CSRFToken"]
    assert token
    response = csrf_client.post(
        flag_url, {"flagged": "1"}, HTTP_HX_REQUEST="true", HTTP_X_CSRFTOKEN=token
    )
    assert response.status_code == 200
    turn.refresh_from_db()
    assert turn.flagged is True


# --- untrusted model output --------------------------------------------------------------


def test_it_escapes_model_output_on_every_page(editor_client, episode):
    Turn.objects.filter(episode=episode, index=1).update(
        model_text=HOSTILE,
        reasoning_text=HOSTILE,
        tool_calls=[{"id": "c", "type": "function", "function": {"name": HOSTILE}}],
        error=HOSTILE,
        error_kind="json",
        note="<img src=x onerror=alert(2)>",
        observation_text="</script><script>alert(3)</script>",
    )
    Episode.objects.filter(id=episode.id).update(error=HOSTILE)
    RolloutBatch.objects.filter(id=episode.batch_id).update(
        name="<b>batch</b>", error=HOSTILE, model="<i>m</i>"
    )
    pages = {
        "episode": reverse("rollouts:episode_detail", args=[episode.id]),
        "turns": reverse("rollouts:turn_list"),
        "batch": reverse("rollouts:batch_detail", args=[episode.batch_id]),
        "batches": reverse("rollouts:batch_list"),
    }
    for name, url in pages.items():
        body = editor_client.get(url).content.decode()
        for raw in (HOSTILE, "<img src=x", "</script><script>", "<b>batch</b>", "<i>m</i>"):
            assert raw not in body, (name, raw)
    turns_body = editor_client.get(pages["turns"]).content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in turns_body
    # The turn's texts come as JSON, set as text by the viewer, never as markup.
    turn = editor_client.get(reverse("rollouts:episode_turn", args=[episode.id, 1]))
    assert turn["Content-Type"] == "application/json"
    assert turn["X-Content-Type-Options"] == "nosniff"
    assert (turn.json()["model_text"], turn.json()["error"]) == (HOSTILE, HOSTILE)


# --- the episode viewer ------------------------------------------------------------------


def test_it_bounds_the_episode_viewer_queries_whatever_the_length(
    editor_client, django_assert_max_num_queries, db
):
    short, long_ = _played(4, seeds=(2,))[0], _played(120, seeds=(3,))[0]
    assert long_.turns.count() == 120
    for episode in (short, long_):
        url = reverse("rollouts:episode_detail", args=[episode.id])
        # Session, user, permissions (user's and groups'), episode, turns (with their
        # frames), turns with errors, turns with unlocks, its forks, the fork form's
        # endpoints: none grows with the number of turns.
        with django_assert_max_num_queries(10):
            response = editor_client.get(url)
        assert response.status_code == 200
        assert response.context["turn_count"] == episode.turns.count()


def test_it_shows_the_images_the_model_saw_and_the_turn_asked_for(viewer_client, episode):
    frames = {f.step: f.sha256 for f in episode.frames.all()}
    Turn.objects.filter(episode=episode, index=3).update(
        request_messages=[
            {"role": "system", "content": "rules"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "obs"},
                    {"type": "image_url", "image_url": {"frame_step": 2}},
                    {"type": "image_url", "image_url": {"frame_step": 3}},
                ],
            },
        ]
    )
    response = viewer_client.get(
        reverse("rollouts:episode_detail", args=[episode.id]), {"turn": "3"}
    )

    def turn(index: int) -> dict:
        return viewer_client.get(reverse("rollouts:episode_turn", args=[episode.id, index])).json()

    assert turn(3)["seen"] == [
        {"step": 2, "frame": frames[2]},
        {"step": 3, "frame": frames[3]},
    ]
    # A baseline sends no request: it saw its own frame.
    assert turn(0)["seen"] == [{"step": 0, "frame": frames[0]}]
    assert turn(1)["frame"] == frames[1]
    assert response.context["viewer_config"]["turnIndex"] == 3
    body = response.content.decode()
    assert "image-rendering: pixelated" not in body  # lives in the stylesheet
    assert 'class="pixel"' in body
    # The frame at the cursor is on the page from the start.
    assert reverse("rollouts:frame_image", args=[frames[3]]) in body
    far = viewer_client.get(reverse("rollouts:episode_detail", args=[episode.id]), {"turn": "99"})
    assert far.context["viewer_config"]["turnIndex"] == episode.turns.count() - 1
    missing = viewer_client.get(reverse("rollouts:episode_detail", args=[10**9]))
    assert missing.status_code == 404


# --- batches -----------------------------------------------------------------------------


def test_it_sorts_a_batchs_episodes_and_shows_its_score(viewer_client, db):
    episodes = _played(4, seeds=(1, 2, 3))
    for episode, reward, count in zip(episodes, (1.0, 3.0, 2.0), (0, 2, 1), strict=True):
        Episode.objects.filter(id=episode.id).update(
            total_reward=reward,
            achievement_count=count,
            achievements={"collect_wood": 3, "place_table": 4}
            if count == 2
            else ({"collect_wood": 2} if count == 1 else {}),
        )
    url = reverse("rollouts:batch_detail", args=[episodes[0].batch_id])
    seeds = lambda response: [e.seed for e in response.context["episodes"]]  # noqa: E731
    assert seeds(viewer_client.get(url)) == [1, 2, 3]
    assert seeds(viewer_client.get(url, {"sort": "-reward"})) == [2, 3, 1]
    assert seeds(viewer_client.get(url, {"sort": "achievements"})) == [1, 3, 2]
    assert seeds(viewer_client.get(url, {"sort": "-seed"})) == [3, 2, 1]
    assert seeds(viewer_client.get(url, {"sort": "drop table"})) == [1, 2, 3]
    response = viewer_client.get(url)
    rates = dict(response.context["rates"])
    assert rates["collect_wood"] == pytest.approx(200 / 3)
    assert rates["place_table"] == pytest.approx(100 / 3)
    # exp((ln(1 + 200/3) + ln(1 + 100/3)) / 22) - 1 = 0.4223..., in percent, by hand.
    assert response.context["score"] == "0.42%"
    assert 'class="bar-fill" style="width: 66.7%"' in response.content.decode()
    assert viewer_client.get(reverse("rollouts:batch_detail", args=[10**9])).status_code == 404


def test_it_polls_batch_progress_only_while_a_batch_runs(viewer_client, episode):
    url = reverse("rollouts:batch_list")
    assert "hx-trigger" not in viewer_client.get(url).content.decode()
    running = services.batch_create(
        settings=RolloutSettings(policy="scripted", seeds=(4, 5), steps=3), enqueue=False
    )
    RolloutBatch.objects.filter(id=running.id).update(
        status=RolloutBatch.Status.RUNNING, episodes_finished=1
    )
    page = viewer_client.get(url)
    assert 'hx-trigger="every 2s"' in page.content.decode()
    assert [b.id for b in page.context["page"]] == [running.id, episode.batch_id]
    partial = viewer_client.get(url, HTTP_HX_REQUEST="true")
    assert partial.content.decode().lstrip().startswith('<div id="batch-table"')
    assert "1 / 2" in partial.content.decode()
    detail = reverse("rollouts:batch_detail", args=[running.id])
    assert 'hx-trigger="every 2s"' in viewer_client.get(detail).content.decode()
    RolloutBatch.objects.filter(id=running.id).update(status=RolloutBatch.Status.FINISHED)
    ended = viewer_client.get(detail, {"poll": "1"}, HTTP_HX_REQUEST="true")
    assert ended["HX-Refresh"] == "true"


def test_it_paginates_batches_newest_first(viewer_client, db):
    for seed in range(30):
        services.batch_create(
            settings=RolloutSettings(policy="random", seeds=(seed,), steps=2), enqueue=False
        )
    first = viewer_client.get(reverse("rollouts:batch_list"))
    ids = [b.id for b in first.context["page"]]
    assert len(ids) == 25
    assert ids == sorted(ids, reverse=True)
    second = viewer_client.get(reverse("rollouts:batch_list"), {"page": 2})
    assert len(second.context["page"]) == 5
    assert max(b.id for b in second.context["page"]) < min(ids)


# --- turn list and bulk flags ------------------------------------------------------------


def test_it_filters_the_turn_list(viewer_client, db):
    first, second = _played(30, seeds=(1, 2))
    Turn.objects.filter(episode=first, index=4).update(
        achievements_unlocked=["collect_wood"], flagged=True
    )
    Turn.objects.filter(episode=second, index=7).update(error="timeout", error_kind="timeout")
    url = reverse("rollouts:turn_list")
    count = lambda **q: viewer_client.get(url, q).context["count"].value  # noqa: E731
    assert count() == 60
    assert count(batch=first.batch_id) == 60
    assert count(flagged="only") == 1
    assert count(flagged="exclude") == 59
    assert count(has_error="yes") == 1
    assert count(achievement="collect_wood") == 1
    assert count(achievement="collect_wood", flagged="exclude") == 0
    assert count(model="nobody") == 0
    response = viewer_client.get(url, {"achievement": "collect_unicorns"})
    assert response.status_code == 200
    assert response.context["page"] is None
    assert "achievement" in response.context["form"].errors
    # Pages follow cursors (keyset), and keep the filters: 59 turns are 50 + 9.
    page_one = viewer_client.get(url, {"flagged": "exclude"})
    shown = [(t.episode_id, t.index) for t in page_one.context["page"]]
    first_rest = [(first.id, i) for i in range(30) if i != 4]  # turn 4 is flagged
    assert shown == [(second.id, i) for i in range(30)] + first_rest[:20]
    next_link = re.search(r'href="\?([^"]*)" rel="next"', page_one.content.decode())
    assert next_link.group(1).startswith("flagged=exclude&amp;after=")
    page_two = viewer_client.get(f"{url}?{next_link.group(1).replace('&amp;', '&')}")
    shown_two = [(t.episode_id, t.index) for t in page_two.context["page"]]
    assert shown_two == first_rest[20:]
    assert 'rel="next"' not in page_two.content.decode()
    prev_link = re.search(r'href="\?([^"]*)" rel="prev"', page_two.content.decode())
    back = viewer_client.get(f"{url}?{prev_link.group(1).replace('&amp;', '&')}")
    assert [(t.episode_id, t.index) for t in back.context["page"]] == shown
    assert 'rel="prev"' not in back.content.decode()
    # A forged cursor is the first page, not an error.
    forged = viewer_client.get(url, {"flagged": "exclude", "after": "%00' OR 1=1"})
    assert [(t.episode_id, t.index) for t in forged.context["page"]] == shown


def test_it_pages_a_sorted_turn_list_by_cursor_through_ties(viewer_client, db):
    _played(30, seeds=(1, 2))
    for turn in Turn.objects.all():
        Turn.objects.filter(id=turn.id).update(reward=float(turn.index % 3))
    # Sorted here, not by the code under test: reward descending, then episode, then turn.
    expected = sorted(
        Turn.objects.values_list("reward", "episode_id", "index"),
        key=lambda t: (-t[0], t[1], t[2]),
    )
    url = reverse("rollouts:turn_list")
    seen, query = [], {"sort": "-reward"}
    while True:
        response = viewer_client.get(url, query)
        seen += [(t.reward, t.episode_id, t.index) for t in response.context["page"]]
        link = re.search(r'href="\?([^"]*)" rel="next"', response.content.decode())
        if link is None:
            break
        query = dict(part.split("=", 1) for part in link.group(1).split("&amp;"))
        assert query["sort"] == "-reward"  # the cursor keeps its order
    assert seen == expected and len(seen) == 60


def test_it_says_about_when_the_count_is_an_estimate(editor_client, settings, db):
    _played(30, seeds=(1, 2))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE rollouts_turn")
    settings.STUDIO_EXACT_COUNT_UP_TO = 10
    page = editor_client.get(reverse("rollouts:turn_list"))
    count = page.context["count"]
    # 60 turns, past the bound of 10: the planner's estimate (60 once analysed), so marked.
    assert (count.value, count.estimated) == (60, True)
    assert 'about <strong data-count="turns" data-estimated="true">60</strong>' in (
        page.content.decode()
    )
    confirm = editor_client.get(reverse("rollouts:turns_bulk_flag"), {"set_flagged": "1"})
    assert "Flag about 60 turns?" in confirm.content.decode()
    settings.STUDIO_EXACT_COUNT_UP_TO = 60
    exact = editor_client.get(reverse("rollouts:turn_list")).content.decode()
    assert '<strong data-count="turns">60</strong> turns match' in exact
    assert 'data-estimated="true"' not in exact


def test_it_bulk_flags_every_matching_turn_on_the_worker_after_a_confirmation(
    client, editor, celery_worker
):
    client.force_login(editor)
    editor_client = client
    first, _second = _played(40, seeds=(1, 2))
    other = _played(5, seeds=(9,))[0]
    url = reverse("rollouts:turns_bulk_flag")
    query = {"batch": first.batch_id, "set_flagged": "1"}
    confirm = editor_client.get(url, query)
    assert confirm.status_code == 200
    # Both episodes, more than one page of 50; exact (below the estimate threshold).
    assert (confirm.context["count"].value, confirm.context["count"].estimated) == (80, False)
    assert "Flag 80 turns" in confirm.content.decode()
    assert not Turn.objects.filter(flagged=True).exists()  # a GET changes nothing
    done = editor_client.post(url, query)
    assert done.status_code == 302
    job = TurnBulkFlag.objects.get()
    assert done["Location"] == reverse("rollouts:turn_bulk_flag_detail", args=[job.id])
    job = wait_for_row(job, statuses=JOB_ENDS)
    assert (job.status, job.changed, job.total) == ("done", 80, 80)
    assert Turn.objects.filter(flagged=True).count() == 80
    assert not other.turns.filter(flagged=True).exists()
    assert set(Turn.objects.filter(flagged=True).values_list("reviewed_by", flat=True)) == {
        editor.id
    }
    page = editor_client.get(done["Location"]).content.decode()
    assert 'Flagged <span data-count="changed">80</span> turns.' in page
    assert f'href="/turns/?batch={first.batch_id}"' in page
    assert "hx-trigger" not in page  # done: no more polling
    undo = editor_client.post(url, {"flagged": "only", "set_flagged": "0"})
    assert undo.status_code == 302
    assert wait_for_row(TurnBulkFlag.objects.latest("id"), statuses=JOB_ENDS).changed == 80
    assert not Turn.objects.filter(flagged=True).exists()
    assert editor_client.post(url, {"set_flagged": "maybe"}).status_code == 400
    assert editor_client.post(url, {"achievement": "nope", "set_flagged": "1"}).status_code == 400
    assert TurnBulkFlag.objects.count() == 2


def test_it_shows_a_running_bulk_flags_progress_and_polls(editor_client, editor, db):
    job = TurnBulkFlag.objects.create(
        filters={"flagged": "exclude"},
        flagged=True,
        status="running",
        total=2_000_000,
        total_estimated=True,
        changed=500_000,
        created_by=editor,
    )
    url = reverse("rollouts:turn_bulk_flag_detail", args=[job.id])
    page = editor_client.get(url).content.decode()
    assert '<span data-count="changed">500,000</span> of about 2,000,000 turns (25%)' in page
    assert 'hx-trigger="every 1s"' in page
    assert 'href="/turns/?flagged=exclude"' in page
    partial = editor_client.get(url, HTTP_HX_REQUEST="true").content.decode()
    assert partial.startswith('<div id="bulk-flag-progress" data-status="running"')
    assert (
        editor_client.get(reverse("rollouts:turn_bulk_flag_detail", args=[10**9])).status_code
        == 404
    )


# --- frames ------------------------------------------------------------------------------


def test_it_serves_frames_by_sha256_with_immutable_caching(viewer_client, episode):
    sha = episode.frames.first().sha256
    url = reverse("rollouts:frame_image", args=[sha])
    response = viewer_client.get(url)
    assert response.status_code == 200
    assert response["Content-Type"] == "image/png"
    assert "immutable" in response["Cache-Control"]
    assert "max-age=31536000" in response["Cache-Control"]
    assert response.content.startswith(b"\x89PNG")
    cached = viewer_client.get(url, HTTP_IF_NONE_MATCH=f'"{sha}"')
    assert cached.status_code == 304
    assert viewer_client.get("/frames/" + "a" * 64 + ".png").status_code == 404
    assert viewer_client.get("/frames/..%2F..%2Fetc%2Fpasswd.png").status_code == 404
    assert viewer_client.get("/frames/" + sha.upper() + ".png").status_code == 404


def test_it_shows_the_mean_achievements_of_finished_episodes(viewer_client, db):
    first, second, third = _played(3, seeds=(1, 2, 3))
    Episode.objects.filter(id=first.id).update(achievement_count=2)
    Episode.objects.filter(id=second.id).update(achievement_count=5)
    Episode.objects.filter(id=third.id).update(achievement_count=20, status="failed")
    empty = services.batch_create(
        settings=RolloutSettings(policy="scripted", seeds=(7,), steps=3), enqueue=False
    )
    response = viewer_client.get(reverse("rollouts:batch_list"))
    means = {b.id: b.mean_achievements for b in response.context["page"]}
    assert means == {first.batch_id: pytest.approx(3.5), empty.id: None}
    assert "3.50" in response.content.decode()
