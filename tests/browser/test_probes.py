"""The probe pages in headless Debian Chromium: a run's wrong answers reviewed with the keys
on a phone and a desktop (screenshots), and every probe page fitting 360 to 2,560 px.

The set is built by the real service from a recorded batch; the runs are asked of the real
local chat server, which answers "A" to every question (and, to the questions on the facing
cell, a hostile text naming no choice)."""

from __future__ import annotations

import pytest
from playwright.sync_api import Browser, Page, expect

from probes import runs
from probes.models import ProbeAnswer, ProbeQuestion, ProbeRun
from probes.services import probe_set_create
from rollouts.review.turn_selection import TurnSelection
from rollouts.tests import openai_server as replies
from rollouts.tests.helpers import record_batch
from tests.browser.support import log_in_reviewer, screenshot_dir

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SCREENSHOTS = screenshot_dir()
HOSTILE = "<img src=x onerror=alert(1)>"


def _answering(letter: str):
    def respond(body: dict) -> replies.Reply:
        question = body["messages"][-1]["content"][-1]["text"]
        if "player is facing" in question:
            return replies.text(f"{HOSTILE} I cannot tell")
        return replies.text(letter)

    return respond


def _probe_run(chat_server, chat_endpoint, *, letter: str = "A", observation: str = "image"):
    chat_server.responder = _answering(letter)
    batch = record_batch(seeds=(0, 1), steps=80, name="scripted frames")
    probe_set = probe_set_create(
        filters=TurnSelection(batches=(batch.id,)), per_episode=4, seed=2, name="scripted frames"
    )
    run = runs.probe_run_create(
        probe_set=probe_set,
        endpoint_name=chat_endpoint.name,
        model="vlm-test",
        observation=observation,
        enqueue=False,
    )
    # One thread: the shared PostgreSQL's connections are few.
    run = runs.probe_run_inline(run=run, workers=1)
    assert run.status == ProbeRun.Status.DONE, run.error
    return run


def _fits(page: Page, width: int) -> None:
    """The page itself never scrolls sideways (wide tables scroll inside their box)."""
    assert page.evaluate("document.documentElement.scrollWidth") <= width, page.url


@pytest.mark.parametrize("width", [390, 1400])
def test_it_reviews_a_runs_wrong_answers_with_the_keys(
    studio_page: Page, live_server, chat_server, chat_endpoint, width: int
):
    run = _probe_run(chat_server, chat_endpoint)
    # Wrong: a choice named, not the right one (the facing questions, named none, are errors).
    wrong = [
        a
        for a in ProbeAnswer.objects.filter(run=run, correct=False, error_kind="")
        .select_related("question")
        .order_by("question__index")
    ]
    assert len(wrong) >= 3
    page = studio_page
    page.set_viewport_size({"width": width, "height": 900})
    log_in_reviewer(page, live_server.url, f"/probes/runs/{run.id}/", f"reviewer{width}")

    expect(page.locator("h1")).to_contain_text(f"Run {run.id}")
    expect(page.locator("[data-progress]")).to_have_text(
        f"{run.questions_total} / {run.questions_total}"
    )
    # The chart in the layout that fits, and one confusion matrix per kind.
    shown = "svg.chart-narrow" if width < 800 else "svg.chart-wide"
    hidden = "svg.chart-wide" if width < 800 else "svg.chart-narrow"
    expect(page.locator(shown)).to_be_visible()
    expect(page.locator(hidden)).to_be_hidden()
    kinds = set(
        ProbeQuestion.objects.filter(probe_set=run.probe_set).values_list("kind", flat=True)
    )
    expect(page.locator("table.confusion")).to_have_count(len(kinds))
    # The wrong answers, each with its frame enlarged (drawn pixelated), its question, the
    # right answer and the model's text, shown as text.
    cards = page.locator("article.answer")
    expect(cards).to_have_count(min(len(wrong), 30))
    first = cards.nth(0)
    expect(first.locator(".question")).to_have_text(wrong[0].question.text)
    expect(first.locator("li.is-answer")).to_contain_text(wrong[0].question.answer)
    frame = first.locator(".answer-frame img")
    # studio.css's img.pixel: blocky pixels, not a blur (Chromium applies `crisp-edges`).
    assert frame.evaluate("img => getComputedStyle(img).imageRendering") in (
        "pixelated",
        "crisp-edges",
    )
    frame.scroll_into_view_if_needed()
    assert frame.evaluate("img => img.getBoundingClientRect().width") >= min(256, width - 80)
    _fits(page, width)

    # Keys: → to the second answer, f flags it, n writes a note, Ctrl+Enter saves it.
    page.locator("h1").click()
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    second = cards.nth(1)
    expect(second).to_have_class("answer card wrong current")
    page.keyboard.press("f")
    expect(second.locator("[data-flag]")).to_have_attribute("aria-pressed", "true")
    expect(second).to_have_class("answer card wrong current flagged")
    page.keyboard.press("n")
    expect(second.locator("textarea")).to_be_focused()
    page.keyboard.type("sees a cow where there is none")
    page.keyboard.press("Control+Enter")
    expect(second.locator(".note-status")).to_contain_text("Note saved")
    flagged = ProbeAnswer.objects.get(id=wrong[1].id)
    assert flagged.flagged and flagged.note == "sees a cow where there is none"
    assert ProbeAnswer.objects.filter(run=run, flagged=True).count() == 1
    page.keyboard.press("?")
    expect(page.locator("#help")).to_be_visible()
    page.keyboard.press("Escape")
    expect(page.locator("#help")).to_be_hidden()

    # The README's picture (docs/screenshots with UPDATE_SCREENSHOTS=1): the desktop's top;
    # the rest under var/screenshots.
    page.evaluate("window.scrollTo(0, 0)")
    if width == 1400:
        page.screenshot(path=str(SCREENSHOTS / "probe-run.png"))
    shots = screenshot_dir(docs=False)
    page.screenshot(path=str(shots / f"probe-run-{width}.png"), full_page=True)
    first.scroll_into_view_if_needed()
    page.screenshot(path=str(shots / f"probe-answers-{width}.png"))

    # The errors, apart: the hostile text naming no choice, shown as text.
    page.goto(f"{live_server.url}/probes/runs/{run.id}/?show=errors&kind=facing")
    facing = page.locator("article.answer", has_text="player is facing").first
    expect(facing.locator("pre.code")).to_contain_text(HOSTILE)
    assert page.evaluate("() => document.querySelectorAll('img[src=x]').length") == 0
    _fits(page, width)


@pytest.mark.parametrize("width", [360, 2560])
def test_every_probe_page_fits_the_screen(
    chromium: Browser, live_server, chat_server, chat_endpoint, width: int
):
    run = _probe_run(chat_server, chat_endpoint)
    chat_server.responder = _answering("B")
    other = runs.probe_run_inline(
        run=runs.probe_run_create(
            probe_set=run.probe_set,
            endpoint_name=chat_endpoint.name,
            model="a-rather-long-model-name-of-a-fine-tuned-checkpoint:ft-2026-12-06",
            observation="text",
            enqueue=False,
        ),
        workers=1,
    )
    context = chromium.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    log_in_reviewer(page, live_server.url, "/probes/", f"looker{width}")
    for path in (
        "/probes/",
        f"/probes/sets/{run.probe_set_id}/",
        f"/probes/runs/{run.id}/",
        f"/probes/runs/{other.id}/?show=all",
        f"/probes/compare/?runs={run.id},{other.id}",
        "/probes/leaderboard/",
    ):
        response = page.goto(live_server.url + path)
        assert response is not None and response.status == 200, path
        expect(page.locator("h1")).to_be_visible()
        _fits(page, width)
    expect(page.locator(f'tr[data-run="{other.id}"]')).to_be_visible()
    page.screenshot(path=str(screenshot_dir(docs=False) / f"probe-leaderboard-{width}.png"))
    context.close()


def test_a_user_builds_a_set_runs_a_model_on_the_workers_and_watches_it_end(
    studio_page: Page, live_server, celery_worker, chat_server, chat_endpoint
):
    """The issue's first steps from the browser alone: a set from a batch, a run started on
    it, answered by a real Celery worker, its page refreshing itself until the run ends."""
    answer = _answering("A")

    def slowly(body: dict) -> replies.Reply:
        # 55 questions at 0.3 s, 4 at a time: the run page is seen answering for seconds.
        reply = answer(body)
        reply.delay = 0.3
        return reply

    chat_server.responder = slowly
    batch = record_batch(seeds=(3,), steps=30, name="to probe")
    page = studio_page
    log_in_reviewer(page, live_server.url, "/probes/", "newcomer")

    page.select_option("#id_batch", str(batch.id))
    page.fill("#id_name", "first probes")
    page.fill("#id_per_episode", "5")
    page.check("#set-form input[value=count]")
    page.check("#set-form input[value=night]")
    page.click("#set-form button[type=submit]")
    probe_set = ProbeQuestion.objects.select_related("probe_set").first().probe_set
    expect(page).to_have_url(f"{live_server.url}/probes/sets/{probe_set.id}/")
    # 5 frames: 10 things to count and "is it night" on each.
    assert probe_set.questions.count() == 5 * 11
    expect(page.locator('[data-kind="night"] [data-warning]')).to_be_visible()

    page.select_option("#id_endpoint", chat_endpoint.name)
    page.fill("#id_model", "vlm-first")
    page.click("#run-form button[type=submit]")
    run = ProbeRun.objects.get()
    expect(page).to_have_url(f"{live_server.url}/probes/runs/{run.id}/")
    # The worker answers while the page refreshes its numbers, then reloads once it ended.
    expect(page.locator("#run-body[hx-get]")).to_be_visible()
    assert page.locator("h1 .badge").text_content() in ("pending", "running")
    expect(page.locator("h1 .badge")).to_have_text("done", timeout=60_000)
    expect(page.locator("#run-body[hx-get]")).to_have_count(0)
    right = sum(q.choices[0] == q.answer for q in probe_set.questions.all())
    expect(page.locator("[data-progress]")).to_have_text("55 / 55")
    expect(page.locator("[data-accuracy]")).to_have_text(f"{100 * right / 55:.1f}%")
    assert len(chat_server.requests) == 55


@pytest.mark.parametrize("width", [390, 1400])
def test_a_run_whose_every_answer_is_an_error_stands_apart_from_the_ranking(
    studio_page: Page, live_server, chat_server, chat_endpoint, width: int
):
    """A server that answers every question with a tool call, beside one that answers: the
    first is no blind model at 0%, it is listed apart, and the comparison says why."""
    real = _probe_run(chat_server, chat_endpoint)
    chat_server.responder = lambda body: replies.tool_call("noop")
    blind = runs.probe_run_inline(
        run=runs.probe_run_create(
            probe_set=real.probe_set,
            endpoint_name=chat_endpoint.name,
            model="tool-caller",
            enqueue=False,
        ),
        workers=1,
    )
    total = blind.questions_total
    assert blind.status == ProbeRun.Status.DONE and blind.errors == total
    # The real run's facing questions, answered with a text naming no choice, are its errors.
    facing = ProbeQuestion.objects.filter(probe_set=real.probe_set, kind="facing").count()
    assert real.errors == facing and 0 < facing < 0.2 * total

    page = studio_page
    page.set_viewport_size({"width": width, "height": 900})
    log_in_reviewer(page, live_server.url, "/probes/leaderboard/", f"apart{width}")
    board = page.locator(f"#set-{real.probe_set_id}")
    ranked = board.locator("table[data-ranked] tbody tr[data-run]")
    expect(ranked).to_have_count(1)
    expect(ranked.first).to_have_attribute("data-run", str(real.id))
    expect(ranked.first.locator("[data-errors]")).to_have_text(
        f"{facing} {100 * facing / total:.1f}%".replace(".0%", "%")
    )
    unranked = board.locator("table[data-unranked] tbody tr[data-run]")
    expect(unranked).to_have_count(1)
    expect(unranked.first).to_have_attribute("data-run", str(blind.id))
    expect(unranked.first.locator("[data-error-share]")).to_have_text(
        f"100% errors {total} of {total}"
    )
    errors_header = board.locator("table[data-ranked] th", has_text="Errors")
    errors_header.scroll_into_view_if_needed()
    expect(errors_header).to_be_visible()
    if width >= 1400:
        # Every header of the ranking within its box: nothing cut at the right.
        box = board.locator("table[data-ranked]").evaluate(
            "t => [t.parentElement.clientWidth, t.scrollWidth]"
        )
        assert box[1] <= box[0], box
    _fits(page, width)
    page.screenshot(
        path=str(screenshot_dir(docs=False) / f"probe-leaderboard-errors-{width}.png"),
        full_page=True,
    )

    page.goto(f"{live_server.url}/probes/compare/?runs={real.id},{blind.id}")
    paired = page.locator("#paired")
    expect(paired.locator("[data-answered-by-both]")).to_have_text("0 questions answered by both")
    expect(paired.locator("[data-both-errored]")).to_have_text(f"{facing} errored in both")
    expect(paired.locator("[data-other-errored]")).to_have_text(
        f"{total - facing} in #{blind.id} only"
    )
    every_kind = page.locator('#outcome-table tr[data-kind="all"] td')
    expect(every_kind).to_have_text(
        [str(total), "0", "0", "0", "0", str(facing), "0", str(total - facing)]
    )
    expect(page.locator("#differing")).to_contain_text("None: no question was answered by both.")
    _fits(page, width)
    page.screenshot(
        path=str(screenshot_dir(docs=False) / f"probe-compare-errors-{width}.png"),
        full_page=True,
    )

    # Its own page: a banner, not a red "below chance" on every kind.
    page.goto(f"{live_server.url}/probes/runs/{blind.id}/")
    expect(page.locator("#errors-over-limit")).to_contain_text(
        f"{total} of {total} answers are errors (100%), more than 20%."
    )
    expect(page.locator("#kind-table .error")).to_have_count(0)
    _fits(page, width)
    page.screenshot(
        path=str(screenshot_dir(docs=False) / f"probe-run-errors-{width}.png"), full_page=True
    )
