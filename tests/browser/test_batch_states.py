"""What the batch pages offer and whether they refresh, as a batch runs, ends or is left open,
at a phone's width (390 px) and a desktop's (1,400 px), in headless Chromium."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from rollouts.models import Episode
from rollouts.play import services as services_play
from rollouts.recording import services
from rollouts.rollout_settings import RolloutSettings
from studio.testing import backdate
from tests.browser.support import log_in_reviewer

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
WIDTHS = [390, 1400]


def _log_in(page: Page, base_url: str, path: str) -> User:
    return log_in_reviewer(page, base_url, path, "player")


def _requests_to(page: Page, path: str, *, seconds: float) -> int:
    """How many requests the page sends to `path` (its own polling) in `seconds`."""
    sent: list[str] = []
    listener = lambda request: sent.append(request.url)  # noqa: E731
    page.on("request", listener)
    page.wait_for_timeout(seconds * 1000)
    page.remove_listener("request", listener)
    return sum(1 for url in sent if path in url)


def _fits(page: Page, width: int) -> None:
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"the page scrolls sideways at {width} px: {scroll} px"


@pytest.mark.parametrize("width", WIDTHS)
def test_resume_is_offered_once_the_batch_has_ended_with_episodes_to_play(
    studio_page: Page, live_server, width
):
    page = studio_page
    page.set_viewport_size({"width": width, "height": 900})
    batch = services.batch_create(
        settings=RolloutSettings(policy="scripted", seeds=tuple(range(9)), steps=5),
        enqueue=False,
    )
    assert services.episode_run(episode_id=batch.episodes.get(seed=0).id) == "finished"
    services.episode_claim(episode_id=batch.episodes.get(seed=1).id)  # a worker is on it
    _log_in(page, live_server.url, f"/rollouts/{batch.id}/")
    expect(page.locator("h1 .badge")).to_have_text("running")
    # Running, nothing failed: eight episodes are still to be played, not to be resumed.
    expect(page.locator('[data-action="cancel"]')).to_be_visible()
    expect(page.locator('[data-action="resume"]')).to_have_count(0)
    _fits(page, width)

    page.once("dialog", lambda dialog: dialog.accept())
    page.click('[data-action="cancel"]')
    expect(page.locator("h1 .badge")).to_have_text("canceled")
    expect(page.locator('[data-action="resume"]')).to_have_text("Resume (8)")
    expect(page.locator('[data-action="resume"]')).to_be_visible()
    _fits(page, width)
    page.click('[data-action="resume"]')
    expect(page.locator(".messages")).to_contain_text("Resumed: 8 unfinished episodes queued.")
    expect(page.locator('[data-action="resume"]')).to_have_count(0)


@pytest.mark.parametrize("width", WIDTHS)
def test_a_game_left_open_is_shown_idle_and_the_pages_stop_refreshing(
    studio_page: Page, live_server, settings, width
):
    settings.STUDIO_HUMAN_IDLE_SECONDS = 600
    page = studio_page
    page.set_viewport_size({"width": width, "height": 900})
    user = _log_in(page, live_server.url, "/rollouts/")
    game = services_play.play_start(
        settings=services_play.play_settings(seed=2, steps=50, image_size=64), user=user
    )
    page.reload()
    # Being played: shown running, the list refreshes itself (every 2 s).
    expect(page.locator("#batch-table .badge")).to_have_text("running")
    assert _requests_to(page, "/rollouts/", seconds=2.6) >= 1

    # Nobody has pressed a key for longer than STUDIO_HUMAN_IDLE_SECONDS.
    backdate(game.batch, field="created_at", seconds=3600)
    backdate(Episode.objects.get(id=game.id), field="heartbeat_at", seconds=700)
    page.reload()
    expect(page.locator("#batch-table .badge")).to_have_text("idle")
    expect(page.locator("#batch-table")).not_to_have_attribute("hx-trigger", "every 2s")
    expect(page.locator("#batch-table")).not_to_contain_text("refreshes every")
    assert _requests_to(page, "/rollouts/", seconds=2.6) == 0
    _fits(page, width)

    page.goto(f"{live_server.url}/rollouts/{game.batch_id}/")
    expect(page.locator("h1 .badge")).to_have_text("idle")
    expect(page.locator("#batch-body")).not_to_contain_text("refreshes every")
    assert _requests_to(page, f"/rollouts/{game.batch_id}/", seconds=2.6) == 0
    expect(page.locator('[data-action="resume"]')).to_have_count(0)
    _fits(page, width)


@pytest.mark.parametrize("width", WIDTHS)
def test_a_canceled_batch_says_canceled_once_and_not_as_an_error(
    studio_page: Page, live_server, width
):
    page = studio_page
    page.set_viewport_size({"width": width, "height": 900})
    batch = services.batch_create(
        settings=RolloutSettings(policy="scripted", seeds=tuple(range(3)), steps=5),
        enqueue=False,
    )
    assert services.batch_cancel(batch=batch) == 3
    _log_in(page, live_server.url, f"/rollouts/{batch.id}/")
    expect(page.locator("h1 .badge")).to_have_text("canceled")
    # Not an error: no alert, nothing in the error colour says it; the count is plain.
    expect(page.locator("[role=alert], .error").filter(has_text="canceled")).to_have_count(0)
    expect(page.locator("[data-canceled]")).to_have_text("3 canceled")
    expect(page.locator("[data-canceled]")).not_to_have_class("warn")
    # A grey badge (red, green and blue alike), not the failed badge's red.
    colour = page.locator("h1 .badge").evaluate("e => getComputedStyle(e).backgroundColor")
    red, green, blue = (int(part) for part in colour[colour.index("(") + 1 : -1].split(","))
    assert red == green == blue, colour
    _fits(page, width)

    page.goto(f"{live_server.url}/rollouts/")
    row = page.locator("#batch-table tbody tr").filter(
        has=page.locator(f'a[href="/rollouts/{batch.id}/"]')
    )
    expect(row.locator(".badge")).to_have_text("canceled")
    expect(row.locator(".error, .warn")).to_have_count(0)
    _fits(page, width)


def _field(page: Page, name: str):
    return page.locator(f'[data-batch-form] .field[data-field="{name}"]')


@pytest.mark.parametrize("width", WIDTHS)
def test_the_batch_form_marks_a_wrong_field_before_it_is_sent_and_clears_it_once_right(
    studio_page: Page, live_server, width
):
    page = studio_page
    page.set_viewport_size({"width": width, "height": 900})
    _log_in(page, live_server.url, "/rollouts/new/")
    expect(page.locator("[data-estimate=none]")).to_be_visible()  # scripted: nothing to pay
    page.fill("#id_seeds", "0-20000")
    seeds = _field(page, "seeds")
    expect(seeds).to_have_class("field has-error")
    expect(seeds.locator("small.error")).to_have_text("More than 10000 seeds in one batch.")
    expect(page.locator("[data-form-errors]")).to_have_text("1 field to correct below.")
    # The box names the field too, instead of "the form has errors".
    expect(page.locator('[data-estimate=incomplete] [data-error-field="seeds"]')).to_contain_text(
        "Seeds"
    )
    # Only the field being typed in: the steps were not touched.
    expect(page.locator("[data-batch-form] .field.has-error")).to_have_count(1)
    _fits(page, width)

    page.fill("#id_seeds", "0-3")
    expect(seeds).not_to_have_class("field has-error")
    expect(seeds.locator("small.error")).to_have_count(0)
    expect(page.locator("[data-form-errors]")).to_be_hidden()
    expect(page.locator("[data-estimate=none]")).to_be_visible()
    _fits(page, width)
