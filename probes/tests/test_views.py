"""The probe pages with personas (anonymous, viewer, editor), on sets built by the real
service from a recorded batch and runs asked of the real local chat server.

Expected numbers are counted here from the stored questions and what the server was told to
answer, never read from `probes.results`."""

from __future__ import annotations

import html
import re
from collections import defaultdict

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from curation.export_options import ExportOptions
from curation.services import dataset_create
from probes import runs
from probes.models import ProbeAnswer, ProbeQuestion, ProbeRun, ProbeSet
from probes.services import probe_set_create
from rollouts.review.turn_selection import TurnSelection
from rollouts.tests import openai_server as replies
from rollouts.tests.helpers import record_batch
from studio.models import Endpoint

pytestmark = pytest.mark.django_db

HOSTILE = "<script>alert('probe')</script>"
FACING_WORDS = "player is facing"  # in the text of every "facing" question


def _answering(letter: str):
    """The server answers `letter` to every question, and a hostile text naming no choice to
    the questions on the facing cell (read by the run as no answer: an error, left out of
    accuracy)."""

    def respond(body: dict) -> replies.Reply:
        question = body["messages"][-1]["content"][-1]["text"]
        if FACING_WORDS in question:
            return replies.text(f"{HOSTILE} maybe")
        return replies.text(letter)

    return respond


def _picked(question: ProbeQuestion, letter: str) -> str:
    """What the run stores as the model's choice, from what the server was told to say."""
    if FACING_WORDS in question.text:
        return ""
    return question.choices["ABCD".index(letter)]


def _run(probe_set: ProbeSet, endpoint: Endpoint, server, letter: str, **options) -> ProbeRun:
    server.responder = _answering(letter)
    run = runs.probe_run_create(
        probe_set=probe_set,
        endpoint_name=endpoint.name,
        model=options.pop("model", "vlm-test"),
        enqueue=False,
        **options,
    )
    run = runs.probe_run_inline(run=run)
    assert run.status == ProbeRun.Status.DONE, run.error
    return run


@pytest.fixture
def probe_set(db) -> ProbeSet:
    batch = record_batch(seeds=(0, 1), steps=60, name="frames")
    return probe_set_create(
        filters=TurnSelection(batches=(batch.id,)), per_episode=3, seed=5, name=f"set {HOSTILE}"
    )


@pytest.fixture
def run_a(probe_set, chat_server, chat_endpoint) -> ProbeRun:
    return _run(probe_set, chat_endpoint, chat_server, "A", model=f"model {HOSTILE}")


def _expected(probe_set: ProbeSet, letter: str) -> dict[str, tuple[int, int, float]]:
    """Per kind: (answered, right, chance as a fraction of those) for a run answering
    `letter`; the facing questions, answered with no choice, are errors and not counted."""
    tally: dict[str, list] = defaultdict(lambda: [0, 0, 0.0])
    for q in ProbeQuestion.objects.filter(probe_set=probe_set):
        row = tally[q.kind]
        if not _picked(q, letter):
            continue
        row[0] += 1
        row[1] += _picked(q, letter) == q.answer
        row[2] += 1 / len(q.choices)
    return {
        kind: (n, right, chance / n if n else 0.0) for kind, (n, right, chance) in tally.items()
    }


def _client_of(user) -> Client:
    """A client of its own (the `client` fixture is the editor's in these tests)."""
    client = Client()
    client.force_login(user)
    return client


def _text(page: str) -> str:
    """The page's text, tags dropped and spaces folded."""
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page)))


def _row(page: str, table_id: str, kind: str) -> str:
    """The text of the row of `kind` in the table with this id."""
    table = page[page.index(f'id="{table_id}"') :]
    table = table[: table.index("</table>")]
    match = re.search(rf'<tr data-kind="{kind}">(.*?)</tr>', table, re.DOTALL)
    assert match, (table_id, kind)
    return _text(match.group(1)).strip()


# --- anonymous -----------------------------------------------------------------------------


def test_it_sends_anonymous_visitors_to_the_login_page(client, run_a):
    answer = run_a.answers.first()
    pages = [
        reverse("probes:probe_list"),
        reverse("probes:set_detail", args=[run_a.probe_set_id]),
        reverse("probes:run_detail", args=[run_a.id]),
        reverse("probes:compare") + f"?runs={run_a.id},{run_a.id}",
        reverse("probes:leaderboard"),
    ]
    for url in pages:
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(reverse("login")), url
    for url in (
        reverse("probes:answer_flag", args=[answer.id]),
        reverse("probes:answer_note", args=[answer.id]),
        reverse("probes:set_create"),
        reverse("probes:run_create", args=[run_a.probe_set_id]),
    ):
        response = client.post(url, {"flagged": "1", "note": "x", "batch": "1"})
        assert response.status_code == 302, url
    assert not ProbeAnswer.objects.filter(flagged=True).exists()
    assert not ProbeAnswer.objects.exclude(note="").exists()
    assert ProbeSet.objects.count() == 1 and ProbeRun.objects.count() == 1


# --- what a viewer sees ---------------------------------------------------------------------


def test_it_lists_sets_and_runs_newest_first_with_their_accuracy(viewer_client, run_a):
    probe_set = run_a.probe_set
    older = probe_set_create(
        filters=TurnSelection(batches=(probe_set.questions.first().episode.batch_id,)),
        per_episode=1,
        kinds=["night"],
        name="the older set",
    )
    ProbeSet.objects.filter(id=older.id).update(created_at=probe_set.created_at.replace(year=2020))
    page = viewer_client.get(reverse("probes:probe_list")).content.decode()
    text = _text(page)
    assert text.index(f"set {HOSTILE}") < text.index("the older set")
    questions = ProbeQuestion.objects.filter(probe_set=probe_set).count()
    expected = _expected(probe_set, "A")
    right = sum(n_right for _, n_right, _ in expected.values())
    answered = sum(n for n, _, _ in expected.values())
    errors = questions - answered  # the facing questions, answered with no choice
    assert errors == ProbeQuestion.objects.filter(probe_set=probe_set, kind="facing").count() > 0
    row = _text(re.search(rf'<tr data-run="{run_a.id}">(.*?)</tr>', page, re.DOTALL).group(1))
    assert f"{questions} / {questions}" in row
    # Accuracy over the answered; the errors apart, with their share.
    assert f" {100 * right / answered:.1f}% {errors} {100 * errors / questions:.1f}% " in row
    assert "done" in row
    # A viewer looks: no form to build a set.
    assert 'id="set-form"' not in page


def test_the_list_names_only_the_kinds_a_set_has_questions_of(viewer_client, probe_set):
    # Balanced, "is the player asleep" (always "no" in these short games) is left out.
    batch_id = probe_set.questions.first().episode.batch_id
    balanced = probe_set_create(
        filters=TurnSelection(batches=(batch_id,)), kinds=["count", "asleep"], balance=True
    )
    assert set(balanced.questions.values_list("kind", flat=True)) == {"count"}
    page = viewer_client.get(reverse("probes:probe_list")).content.decode()
    row = page[page.index(f'<tr data-set="{balanced.id}">') :]
    kinds = re.search(r'<td class="wrap small"[^>]*>(.*?)</td>', row).group(1)
    assert kinds == "count"


def test_a_sets_page_draws_its_right_answers_and_warns_where_one_wins(viewer_client, probe_set):
    page = viewer_client.get(reverse("probes:set_detail", args=[probe_set.id])).content.decode()
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for kind, answer in ProbeQuestion.objects.filter(probe_set=probe_set).values_list(
        "kind", "answer"
    ):
        counts[kind][answer] += 1
    assert counts, "the set has questions"
    warned = 0
    for kind, answers in counts.items():
        block = page[page.index(f'data-kind="{kind}"') :]
        block = block[: block.index('<div class="kind') if '<div class="kind' in block else None]
        total, top = sum(answers.values()), max(answers.values())
        # One bar per answer, its count beside it.
        assert block.count('class="bar-row"') == len(answers), kind
        for answer, n in answers.items():
            assert re.search(
                rf">{re.escape(html.escape(answer))}</span>.*?>{n} <span", block, re.DOTALL
            ), (kind, answer)
        dominated = top >= 0.8 * total
        assert ("data-warning" in block) == dominated, kind
        warned += dominated
    # Short scripted games in daylight: "is it night" is always "no", and said so.
    assert "data-warning" in page[page.index('data-kind="night"') :][:2000]
    assert warned >= 1
    assert HOSTILE not in page and html.escape(HOSTILE) in page


def test_a_runs_page_shows_accuracy_per_kind_against_chance(viewer_client, run_a):
    page = viewer_client.get(reverse("probes:run_detail", args=[run_a.id])).content.decode()
    expected = _expected(run_a.probe_set, "A")
    for kind, (n, right, chance) in expected.items():
        if kind == "facing":
            continue
        row = _row(page, "kind-table", kind)
        assert row.startswith(f"{kind} {n} {right} {100 * right / n:.1f}%"), row
        assert f"{100 * chance:.1f}%" in row
        assert row.endswith(" 0"), row  # no error
    # Every facing question was answered with a text naming no choice: errors, no accuracy,
    # no verdict against chance.
    facing = ProbeQuestion.objects.filter(probe_set=run_a.probe_set, kind="facing").count()
    assert expected["facing"][0] == 0
    row = _row(page, "kind-table", "facing")
    assert row == f"facing 0 0 — — — nothing answered {facing} 100%", row
    # A chart (both layouts) and a confusion matrix per kind.
    assert page.count('<svg class="chart chart-wide"') == 1
    assert page.count('<svg class="chart chart-narrow"') == 1
    assert page.count('<table class="confusion">') == len(expected)


def test_a_runs_page_lists_its_wrong_answers_with_the_frame_escaped(viewer_client, run_a):
    url = reverse("probes:run_detail", args=[run_a.id])
    questions = list(ProbeQuestion.objects.filter(probe_set=run_a.probe_set).order_by("index"))
    # Wrong: a choice named, not the right one. The facing questions named none: errors.
    wrong = [q for q in questions if _picked(q, "A") and _picked(q, "A") != q.answer]
    errors = [q for q in questions if not _picked(q, "A")]
    page = viewer_client.get(url).content.decode()
    assert f'Wrong answers <span class="muted">{len(wrong)}</span>' in page
    assert f'<option value="errors">errors ({len(errors)})</option>' in page
    cards = re.findall(r'<article class="answer card[^"]*" id="answer-(\d+)"', page)
    shown = ProbeAnswer.objects.filter(id__in=[int(i) for i in cards])
    assert {a.question_id for a in shown} == {q.id for q in wrong[: len(cards)]}
    assert all(not a.correct for a in shown)
    first = wrong[0]
    assert f'src="/frames/{first.frame.sha256}.png"' in page
    assert 'class="pixel"' in page
    # The model's text and name are shown as text, never as HTML.
    assert HOSTILE not in page
    assert html.escape(HOSTILE) in page
    # A viewer looks: no flag button, no note form.
    assert "data-flag" not in page and 'class="note-form"' not in page
    # One kind, right answers only: the facing questions were all errors.
    page = viewer_client.get(url + "?show=right&kind=facing").content.decode()
    assert "answer card" not in page and "No right answers here." in page
    page = viewer_client.get(url + "?show=errors&kind=facing").content.decode()
    cards = re.findall(r'<article class="answer card[^"]*" id="answer-(\d+)"', page)
    shown = ProbeAnswer.objects.filter(id__in=[int(i) for i in cards])
    assert {a.question_id for a in shown} == {q.id for q in errors} and errors
    assert all(a.error_kind == "unparsed" for a in shown)
    assert HOSTILE not in page and f"{html.escape(HOSTILE)} maybe" in page


def test_a_running_runs_page_refreshes_itself_until_it_ends(
    viewer_client, probe_set, chat_endpoint
):
    run = runs.probe_run_create(
        probe_set=probe_set, endpoint_name=chat_endpoint.name, model="m", enqueue=False
    )
    url = reverse("probes:run_detail", args=[run.id])
    page = viewer_client.get(url).content.decode()
    assert f'hx-get="{url}?poll=1"' in page and "0 / " in page
    polled = viewer_client.get(url + "?poll=1", headers={"HX-Request": "true"})
    assert polled.status_code == 200 and 'id="run-body"' in polled.content.decode()
    # The lists of runs (all, and the set's) refresh themselves while it answers.
    for page_url in (
        reverse("probes:probe_list"),
        reverse("probes:set_detail", args=[probe_set.id]),
    ):
        page = viewer_client.get(page_url).content.decode()
        table = page[page.index('<div id="run-table"') :][:300]
        assert f'hx-get="{page_url}?poll=1&amp;' in table and 'hx-trigger="every 2s"' in table
        polled = viewer_client.get(page_url + "?poll=1", headers={"HX-Request": "true"})
        assert polled.content.decode().startswith('<div id="run-table"')
    ProbeRun.objects.filter(id=run.id).update(status=ProbeRun.Status.DONE)
    page = viewer_client.get(reverse("probes:probe_list")).content.decode()
    assert "hx-get" not in page[page.index('<div id="run-table"') :][:300]
    ended = viewer_client.get(url + "?poll=1", headers={"HX-Request": "true"})
    assert ended.status_code == 204 and ended["HX-Refresh"] == "true"
    assert "hx-get" not in viewer_client.get(url).content.decode().split('id="run-body"')[1][:80]


# --- flags and notes --------------------------------------------------------------------


def test_a_viewer_cannot_flag_or_note_an_answer(viewer_client, run_a):
    answer = run_a.answers.first()
    assert (
        viewer_client.post(
            reverse("probes:answer_flag", args=[answer.id]), {"flagged": "1"}
        ).status_code
        == 403
    )
    assert (
        viewer_client.post(
            reverse("probes:answer_note", args=[answer.id]), {"note": "x"}
        ).status_code
        == 403
    )
    answer.refresh_from_db()
    assert not answer.flagged and answer.note == ""


def test_an_editor_flags_and_notes_an_answer(editor_client, run_a):
    answer = run_a.answers.filter(correct=False).first()
    flag_url = reverse("probes:answer_flag", args=[answer.id])
    response = editor_client.post(flag_url, {"flagged": "1"}, headers={"HX-Request": "true"})
    assert response.status_code == 200
    assert 'aria-pressed="true"' in response.content.decode()
    # The wanted state, not a toggle: sent twice, still flagged.
    editor_client.post(flag_url, {"flagged": "1"}, headers={"HX-Request": "true"})
    answer.refresh_from_db()
    assert answer.flagged
    note_url = reverse("probes:answer_note", args=[answer.id])
    response = editor_client.post(
        note_url, {"note": f"  {HOSTILE}  "}, headers={"HX-Request": "true"}
    )
    assert response.status_code == 200 and "Note saved" in response.content.decode()
    answer.refresh_from_db()
    assert answer.note == HOSTILE
    # Without htmx: back where the form said, on this site only.
    run_url = reverse("probes:run_detail", args=[run_a.id])
    response = editor_client.post(flag_url, {"flagged": "0", "next": f"{run_url}?show=all"})
    assert response.status_code == 302 and response["Location"] == f"{run_url}?show=all"
    response = editor_client.post(flag_url, {"flagged": "0", "next": "https://elsewhere.test/"})
    assert response["Location"] == run_url
    answer.refresh_from_db()
    assert not answer.flagged
    # Shown escaped, and listed under "flagged" once flagged again.
    editor_client.post(flag_url, {"flagged": "1"})
    page = editor_client.get(run_url + "?show=flagged").content.decode()
    assert f'id="answer-{answer.id}"' in page and page.count("<article") == 1
    assert HOSTILE not in page
    # Bad values: 400, nothing changed.
    assert editor_client.post(flag_url, {"flagged": "maybe"}).status_code == 400
    assert editor_client.post(note_url, {"note": "x" * 10_001}).status_code == 400
    assert editor_client.post(note_url, {"note": "a\x00b"}).status_code == 400
    answer.refresh_from_db()
    assert answer.flagged and answer.note == HOSTILE


# --- building a set, starting a run ------------------------------------------------------


def test_an_editor_builds_a_set_from_a_batch(editor_client, viewer):
    batch = record_batch(seeds=(3,), steps=20)
    data = {"batch": batch.id, "per_episode": "2", "seed": "9", "kinds": ["count", "vital"]}
    assert _client_of(viewer).post(reverse("probes:set_create"), data).status_code == 403
    response = editor_client.post(reverse("probes:set_create"), data)
    probe_set = ProbeSet.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("probes:set_detail", args=[probe_set.id])
    assert probe_set.kinds == ["count", "vital"] and probe_set.frames_count == 2
    assert probe_set.per_episode == 2 and probe_set.seed == 9
    # 10 things to count and 4 vitals on each of the 2 frames.
    assert probe_set.questions.count() == 2 * (10 + 4)
    # Refused with the reason, nothing written.
    for bad, reason in [
        ({"seed": "1"}, "Pick a batch or a dataset"),
        ({"batch": batch.id, "kinds": ["smell"]}, "smell"),
        ({"batch": batch.id, "per_episode": "0"}, "greater than or equal to 1"),
        ({"batch": "99999999999999999999"}, "Select a valid choice"),
    ]:
        response = editor_client.post(reverse("probes:set_create"), bad)
        assert response.status_code == 400, bad
        assert reason in html.unescape(response.content.decode()), bad
    assert ProbeSet.objects.count() == 1
    # From a dataset: the frames of the turns its saved filters select (here the batch's
    # first five turns, by id: five frames, one "is it night" each).
    dataset = dataset_create(
        name="first turns",
        filters=TurnSelection(
            batches=(batch.id,),
            turn_ids=tuple(
                batch.episodes.get().turns.order_by("index").values_list("id", flat=True)[:5]
            ),
        ),
        options=ExportOptions(),
    )
    response = editor_client.post(
        reverse("probes:set_create"), {"dataset": dataset.id, "kinds": ["night"]}
    )
    from_dataset = ProbeSet.objects.latest("id")
    assert response.status_code == 302, response.content.decode()[:2000]
    assert from_dataset.frames_count == 5 and from_dataset.questions.count() == 5
    both = {"batch": batch.id, "dataset": dataset.id}
    assert editor_client.post(reverse("probes:set_create"), both).status_code == 400


def test_an_editor_starts_a_run_on_a_set(editor_client, viewer, probe_set, chat_endpoint):
    url = reverse("probes:run_create", args=[probe_set.id])
    data = {"endpoint": chat_endpoint.name, "model": "vlm-x", "observation": "text"}
    assert _client_of(viewer).post(url, data).status_code == 403
    response = editor_client.post(url, data)
    run = ProbeRun.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("probes:run_detail", args=[run.id])
    assert (run.model, run.observation, run.endpoint_name) == ("vlm-x", "text", "local-test")
    assert run.questions_total == probe_set.questions.count()
    # Only an endpoint an admin named; a known observation.
    for bad in ({**data, "endpoint": "http://evil.test/v1"}, {**data, "observation": "smell"}):
        assert editor_client.post(url, bad).status_code == 400
    assert ProbeRun.objects.count() == 1


def test_an_editor_resumes_a_failed_run_and_it_asks_only_what_is_left(
    editor_client, viewer, probe_set, chat_server, chat_endpoint
):
    chat_server.default = replies.status(401, message="no such key")
    run = runs.probe_run_inline(
        run=runs.probe_run_create(
            probe_set=probe_set, endpoint_name=chat_endpoint.name, model="m", enqueue=False
        )
    )
    assert run.status == ProbeRun.Status.FAILED
    url = reverse("probes:run_detail", args=[run.id])
    page = editor_client.get(url).content.decode()
    assert 'data-action="resume"' in page and html.escape(run.error) in page
    resume = reverse("probes:run_resume", args=[run.id])
    assert _client_of(viewer).post(resume).status_code == 403
    asked = len(chat_server.requests)
    response = editor_client.post(resume)
    assert response.status_code == 302 and response["Location"] == url
    run.refresh_from_db()
    assert run.status in (ProbeRun.Status.PENDING, ProbeRun.Status.RUNNING) and not run.error
    chat_server.responder = _answering("A")
    run = runs.probe_run_inline(run=run)
    assert run.status == ProbeRun.Status.DONE
    assert len(chat_server.requests) - asked == probe_set.questions.count()
    # A finished run is not resumed: nothing sent again.
    editor_client.post(resume)
    assert len(chat_server.requests) - asked == probe_set.questions.count()
    assert 'data-action="resume"' not in editor_client.get(url).content.decode()


def test_an_editor_cancels_a_running_run_and_nothing_more_is_asked(
    editor_client, viewer, probe_set, chat_server, chat_endpoint
):
    chat_server.responder = _answering("A")
    run = runs.probe_run_create(
        probe_set=probe_set, endpoint_name=chat_endpoint.name, model="m", enqueue=False
    )
    url = reverse("probes:run_detail", args=[run.id])
    assert 'data-action="cancel"' in editor_client.get(url).content.decode()
    cancel = reverse("probes:run_cancel", args=[run.id])
    assert _client_of(viewer).post(cancel).status_code == 403
    response = editor_client.post(cancel)
    assert response.status_code == 302 and response["Location"] == url
    run.refresh_from_db()
    assert run.status == ProbeRun.Status.CANCELED and run.error == "canceled"
    # Nothing is asked of a canceled run; its page offers Resume instead of Cancel.
    runs.probe_run_inline(run=run)
    assert chat_server.requests == [] and not run.answers.exists()
    page = editor_client.get(url).content.decode()
    assert 'data-action="cancel"' not in page and 'data-action="resume"' in page
    # Canceled again: nothing to cancel, still the same.
    editor_client.post(cancel)
    run.refresh_from_db()
    assert run.status == ProbeRun.Status.CANCELED


# --- two runs, the leaderboard ----------------------------------------------------------------


def test_it_compares_two_runs_on_the_same_questions(
    viewer_client, probe_set, chat_server, chat_endpoint
):
    base = _run(probe_set, chat_endpoint, chat_server, "A")
    other = _run(probe_set, chat_endpoint, chat_server, "B", model="other")
    page = viewer_client.get(
        reverse("probes:compare") + f"?runs={base.id},{other.id}"
    ).content.decode()
    questions = list(ProbeQuestion.objects.filter(probe_set=probe_set))
    # The facing questions are errors in both runs: counted apart, out of every figure.
    answered = [q for q in questions if q.kind != "facing"]
    facing = len(questions) - len(answered)
    assert f"{len(answered)} questions answered by both" in _text(page)
    assert f"{facing} errored in both" in _text(page)
    for kind in {q.kind for q in answered}:
        of_kind = [q for q in answered if q.kind == kind]
        a_right = [_picked(q, "A") == q.answer for q in of_kind]
        b_right = [_picked(q, "B") == q.answer for q in of_kind]
        only_a = sum(a and not b for a, b in zip(a_right, b_right, strict=True))
        only_b = sum(b and not a for a, b in zip(a_right, b_right, strict=True))
        both = sum(a and b for a, b in zip(a_right, b_right, strict=True))
        n = len(of_kind)
        row = _row(page, "compare-table", kind).split()
        assert row[0] == kind and row[1] == str(n)
        assert row[2] == f"{100 * sum(a_right) / n:.1f}%"
        assert row[4] == f"{100 * sum(b_right) / n:.1f}%"
        difference = 100 * (only_b - only_a) / n
        assert row[6] == (f"{difference:+.1f}".replace("-", "\u2212") if difference else "0.0")
        outcomes = _row(page, "outcome-table", kind).split()
        wrong = n - both - only_a - only_b
        counts = [n, both, wrong, only_a, only_b, 0, 0, 0]
        assert outcomes == [kind, *map(str, counts)], (kind, outcomes)
    assert _row(page, "compare-table", "facing") == "facing 0 — — — — —"
    counts = [facing, 0, 0, 0, 0, facing, 0, 0]
    assert _row(page, "outcome-table", "facing").split() == ["facing", *map(str, counts)]
    differing = sum(
        (_picked(q, "A") == q.answer) != (_picked(q, "B") == q.answer) for q in answered
    )
    assert f'Right in one run, wrong in the other <span class="muted">{differing}</span>' in page
    assert page.count('<svg class="chart chart-wide"') == 1
    # Reachable from a run's page.
    run_page = viewer_client.get(reverse("probes:run_detail", args=[base.id])).content.decode()
    assert f'<option value="{other.id}">' in run_page


def test_the_leaderboard_keeps_the_best_run_of_each_model_and_observation(
    viewer_client, probe_set, chat_server, chat_endpoint
):
    expected = {letter: _expected(probe_set, letter) for letter in "AB"}
    right = {letter: sum(r for _, r, _ in expected[letter].values()) for letter in "AB"}
    best, worst = sorted("AB", key=lambda letter: -right[letter])
    assert right[best] > right[worst], "the two answers score differently on this set"
    runs_by_letter = {
        letter: _run(probe_set, chat_endpoint, chat_server, letter, model="same-model")
        for letter in "AB"
    }
    text_run = _run(
        probe_set, chat_endpoint, chat_server, "A", model="same-model", observation="none"
    )
    page = viewer_client.get(reverse("probes:leaderboard")).content.decode()
    board = page[page.index(f'id="set-{probe_set.id}"') :]
    shown = re.findall(r'<tr data-run="(\d+)">', board)
    assert set(shown) == {str(runs_by_letter[best].id), str(text_run.id)}
    n = sum(n for n, _, _ in expected[best].values())
    assert f"{100 * right[best] / n:.1f}%" in _text(board)
    # Beside the play leaderboard, each linking to the other.
    assert 'href="/leaderboard/"' in page
    play = viewer_client.get(reverse("evaluation:leaderboard")).content.decode()
    assert 'href="/probes/leaderboard/"' in play


# --- bad ids and numbers ------------------------------------------------------------------

HUGE = "9" * 30


def test_bad_ids_and_numbers_answer_400_or_404_never_500(
    editor_client, run_a, probe_set, chat_server, chat_endpoint
):
    other_set = probe_set_create(
        filters=TurnSelection(batches=(probe_set.questions.first().episode.batch_id,)),
        per_episode=1,
        kinds=["night"],
    )
    other = _run(other_set, chat_endpoint, chat_server, "A")
    for url in (
        "/probes/sets/0/",
        f"/probes/sets/{HUGE}/",
        f"/probes/runs/{HUGE}/",
        "/probes/runs/424242/",
        f"/probes/compare/?runs=424242,{run_a.id}",
    ):
        assert editor_client.get(url).status_code == 404, url
    for url in (f"/probes/answers/{HUGE}/flag/", f"/probes/answers/{HUGE}/note/"):
        assert editor_client.post(url, {"flagged": "1", "note": "x"}).status_code == 404, url
    assert editor_client.post(f"/probes/sets/{HUGE}/runs/new/", {}).status_code == 404
    for query in (
        f"{HUGE},1",
        "abc",
        "1",
        "1,2,3",
        f"{run_a.id},{run_a.id}",
        "1e400,2",
        "-1,2",
        "1;2",
    ):
        response = editor_client.get(f"/probes/compare/?runs={query}")
        assert response.status_code == 400, query
    response = editor_client.get(f"/probes/compare/?runs={run_a.id},{other.id}")
    assert response.status_code == 400 and "same set" in response.content.decode()
    for value in ("NaN", "-1", "0", "1e400", HUGE, "abc", "1.5"):
        for url in (
            f"/probes/?sets_page={value}&runs_page={value}",
            f"/probes/sets/{probe_set.id}/?page={value}",
            f"/probes/runs/{run_a.id}/?page={value}&show={value}&kind={value}",
            f"/probes/leaderboard/?page={value}",
        ):
            assert editor_client.get(url).status_code == 200, url


def test_the_lists_cost_as_many_queries_for_one_run_as_for_many(
    viewer_client, viewer, run_a, chat_endpoint
):
    def queries(url: str) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert viewer_client.get(url).status_code == 200
        return len(captured.captured_queries)

    urls = ["/probes/", f"/probes/sets/{run_a.probe_set_id}/", f"/probes/runs/{run_a.id}/"]
    before = [queries(url) for url in urls]
    for model in ("second", "third"):
        runs.probe_run_create(
            probe_set=run_a.probe_set,
            endpoint_name=chat_endpoint.name,
            model=model,
            enqueue=False,
            created_by=viewer,  # its name on each row
        )
    assert [queries(url) for url in urls] == before
