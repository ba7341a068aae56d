"""Runs whose answers are errors, beside a run that answered: a local server answering every
question with a tool call and no text (the run is "done", every answer an error), one
answering each question with a choice's text, and one naming no choice half the time.

An error says nothing about what a model sees: accuracy is over the questions answered, the
errors apart; a run with errors on more than 20% of its answers is flagged on its page, kept
off the leaderboard's ranking and listed apart; the comparison counts errored questions
apart; the command's JSON line says the same. Every figure below is worked out by hand from
the set's twelve questions (six "Is it night?", six "Is the player asleep?", all "no")."""

from __future__ import annotations

import html
import re

import pytest
from django.urls import reverse

from probes.models import ProbeQuestion, ProbeSet
from probes.services import probe_set_create
from probes.tests.helpers import run as command
from rollouts.review.turn_selection import TurnSelection
from rollouts.tests import openai_server as replies
from rollouts.tests.helpers import record_batch

pytestmark = pytest.mark.django_db

TO = "\N{EN DASH}"  # between an interval's ends


@pytest.fixture
def probe_set(db) -> ProbeSet:
    # Six steps: six frames shown by a turn with its text observation (the seventh, after the
    # last action, by none), two questions each. Early in the day, awake: every answer "no".
    batch = record_batch(seeds=(2,), steps=6)
    probe_set = probe_set_create(
        filters=TurnSelection(batches=(batch.id,)), kinds=["night", "asleep"], seed=3
    )
    answers = list(ProbeQuestion.objects.filter(probe_set=probe_set).values_list("kind", "answer"))
    assert sorted(answers) == [("asleep", "no")] * 6 + [("night", "no")] * 6
    return probe_set


def _replying(*, night: str, asleep: str):
    """The server's text to each question: a choice's own text is read as that choice."""

    def respond(body: dict) -> replies.Reply:
        question = body["messages"][-1]["content"][-1]["text"]
        return replies.text(night if question.startswith("Is it night?") else asleep)

    return respond


def _tool_calls(body: dict) -> replies.Reply:
    return replies.tool_call("noop")


def _probe_run(probe_set: ProbeSet, chat_server, endpoint, responder, model: str) -> dict:
    """`probe_run --inline` as from a shell; its JSON line."""
    chat_server.responder = responder
    outcome = command(
        "probe_run", str(probe_set.id), "--endpoint", endpoint.name, "--model", model, "--inline"
    )
    assert outcome.code == 0, outcome.stderr
    return outcome.summary


@pytest.fixture
def blind(probe_set, chat_server, chat_endpoint) -> dict:
    """Every answer a tool call: 12 errors, nothing answered."""
    return _probe_run(probe_set, chat_server, chat_endpoint, _tool_calls, "blind-model")


@pytest.fixture
def sighted(probe_set, chat_server, chat_endpoint) -> dict:
    """Night "no" (right), asleep "yes" (wrong): 6 right of 12 answered, no error."""
    responder = _replying(night="no", asleep="yes")
    return _probe_run(probe_set, chat_server, chat_endpoint, responder, "sighted-model")


@pytest.fixture
def hedging(probe_set, chat_server, chat_endpoint) -> dict:
    """Night "no" (right), asleep "maybe" (no choice: an error): 6 right of 6, 6 errors."""
    responder = _replying(night="no", asleep="maybe")
    return _probe_run(probe_set, chat_server, chat_endpoint, responder, "hedging-model")


def _text(fragment: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", fragment))).strip()


def _row(page: str, table: str, key: str) -> str:
    """The text of the row `<tr data-...="key">` in the element with this id or attribute."""
    start = page.index(table)
    body = page[start : page.index("</table>", start)]
    match = re.search(rf'<tr[^>]* data-(?:kind|run)="{key}"[^>]*>(.*?)</tr>', body, re.DOTALL)
    assert match, (table, key)
    return _text(match.group(1))


def test_the_json_line_gives_accuracy_over_the_answered_and_the_errors_apart(
    blind, sighted, hedging
):
    spec_keys = ["run_id", "set_id", "model", "observation", "questions", "answered", "errors"]
    for summary in (blind, sighted, hedging):
        assert list(summary)[: len(spec_keys) + 2] == [*spec_keys, "accuracy", "kinds"]
    # Every answer a tool call: nothing answered, so no accuracy (null, not 0).
    assert (blind["questions"], blind["answered"], blind["errors"]) == (12, 0, 12)
    assert blind["accuracy"] is None and blind["interval"] is None
    assert blind["error_share"] == 1.0 and blind["errors_over_limit"] is True
    assert blind["kinds"]["night"] == {
        "accuracy": None,
        "interval": None,
        "chance": None,
        "questions": 6,
        "answered": 0,
        "errors": 6,
    }
    assert blind["status"] == "done" and blind["model_calls"] == 12
    # 6 of 12.
    assert (sighted["answered"], sighted["errors"], sighted["accuracy"]) == (12, 0, 0.5)
    assert sighted["errors_over_limit"] is False
    # 6 of the 6 answered; the 6 "maybe" apart.
    assert (hedging["answered"], hedging["errors"], hedging["correct"]) == (6, 6, 6)
    assert hedging["accuracy"] == 1.0 and hedging["error_share"] == 0.5
    assert hedging["kinds"]["asleep"]["accuracy"] is None
    assert hedging["kinds"]["night"]["accuracy"] == 1.0


def test_a_run_whose_every_answer_is_an_error_is_flagged_on_its_page(viewer_client, blind, sighted):
    page = viewer_client.get(reverse("probes:run_detail", args=[blind["run_id"]])).content.decode()
    banner = page[page.index('id="errors-over-limit"') :]
    banner = _text(banner[: banner.index("</div>")])
    assert "12 of 12 answers are errors (100%), more than 20%." in banner
    assert "tool_call 12" in banner
    assert "this run is kept off the perception leaderboard" in banner
    assert _text(re.search(r"data-accuracy>(.*?)</span>", page).group(1)) == "—"
    assert "every answer is an error" in page
    # No verdict against chance where nothing was answered, and no chart of nothing.
    for kind in ("night", "asleep"):
        row = _row(page, 'id="kind-table"', kind)
        assert row == f"{kind} 0 0 — — — nothing answered 6 100%", row
    assert 'class="error">below' not in page and "<svg" not in page

    page = viewer_client.get(
        reverse("probes:run_detail", args=[sighted["run_id"]])
    ).content.decode()
    assert 'id="errors-over-limit"' not in page
    # 6 of 6 (Wilson 61.0% to 100%) is above chance, 0 of 6 (0% to 39.0%) below it.
    assert (
        _row(page, 'id="kind-table"', "night") == f"night 6 6 100.0% 61.0%{TO}100.0% 50.0% above 0"
    )
    assert _row(page, 'id="kind-table"', "asleep") == f"asleep 6 0 0.0% 0.0%{TO}39.0% 50.0% below 0"


def test_the_runs_list_gives_accuracy_over_the_answered_with_the_errors_apart(
    viewer_client, blind, sighted, hedging
):
    page = viewer_client.get(reverse("probes:probe_list")).content.decode()

    def row(summary: dict) -> str:
        return _row(page, 'id="run-table"', str(summary["run_id"]))

    # Asked of all, accuracy of the answered, errors and their share.
    assert " done 12 / 12 — 12 100% " in row(blind)
    assert " done 12 / 12 50.0% 0 " in row(sighted)
    assert " done 12 / 12 100.0% 6 50% " in row(hedging)


def test_the_leaderboard_ranks_only_runs_whose_answers_are_mostly_answers(
    viewer_client, probe_set, blind, sighted, hedging
):
    page = viewer_client.get(reverse("probes:leaderboard")).content.decode()
    board = page[page.index(f'id="set-{probe_set.id}"') :]
    ranked = board[board.index("data-ranked") : board.index("</table>")]
    assert re.findall(r'<tr data-run="(\d+)">', ranked) == [str(sighted["run_id"])]
    assert '<th class="num" title=' in ranked and ">Errors</th>" in ranked
    # Rank 1, 6 of 12 (Wilson 25.4% to 74.6%), no error; night 6 of 6, asleep 0 of 6.
    assert _row(board, "data-ranked", str(sighted["run_id"])) == (
        f"1 sighted-model image 50.0% 25.4%{TO}74.6% 0 0% 100% 61%{TO}100% 0% 0%{TO}39% "
        f"#{sighted['run_id']}"
    )
    unranked = board[board.index("data-unranked") :]
    # Apart, fewest errors first, each with its share of errors.
    rows = re.findall(r'<tr data-run="(\d+)">', unranked[: unranked.index("</table>")])
    assert rows == [
        str(hedging["run_id"]),
        str(blind["run_id"]),
    ]
    assert _row(unranked, "<tbody>", str(blind["run_id"])) == (
        f"blind-model image 100% errors 12 of 12 0 — #{blind['run_id']}"
    )
    assert _row(unranked, "<tbody>", str(hedging["run_id"])) == (
        f"hedging-model image 50% errors 6 of 12 6 100.0% #{hedging['run_id']}"
    )


def test_the_compare_page_counts_errored_questions_apart(viewer_client, blind, sighted, hedging):
    def compare(base: dict, other: dict) -> str:
        url = reverse("probes:compare") + f"?runs={base['run_id']},{other['run_id']}"
        response = viewer_client.get(url)
        assert response.status_code == 200
        return response.content.decode()

    def outcomes(page: str, kind: str) -> list[int]:
        """Asked of both, both right, both wrong, only base right, only other right, both
        errored, only base errored, only other errored."""
        return [int(n) for n in _row(page, 'id="outcome-table"', kind).split()[-8:]]

    # The blind run against the sighted one: nothing answered by both, 12 errored in one.
    page = compare(blind, sighted)
    paired = _text(page[page.index('id="paired"') : page.index('id="compare-table"')])
    assert "0 questions answered by both" in paired and "of 12 asked of both" in paired
    assert f"0 errored in both , 12 in #{blind['run_id']} only" in paired
    assert "both wrong" not in paired
    assert outcomes(page, "all") == [12, 0, 0, 0, 0, 0, 12, 0]
    assert outcomes(page, "night") == [6, 0, 0, 0, 0, 0, 6, 0]
    assert _row(page, 'id="compare-table"', "all") == "every kind 0 — — — — —"
    assert "None: no question was answered by both." in page

    # The blind run against the hedging one: asleep errored in both, night in blind only.
    page = compare(blind, hedging)
    assert outcomes(page, "all") == [12, 0, 0, 0, 0, 6, 6, 0]
    assert outcomes(page, "asleep") == [6, 0, 0, 0, 0, 6, 0, 0]

    # The sighted run against the hedging one: both right on night, asleep errored in one.
    page = compare(sighted, hedging)
    assert "6 questions answered by both" in _text(page)
    assert outcomes(page, "all") == [12, 6, 0, 0, 0, 0, 0, 6]
    assert _row(page, 'id="compare-table"', "night").startswith("night 6 100.0% ")
    assert _row(page, 'id="compare-table"', "asleep") == "asleep 0 — — — — —"
