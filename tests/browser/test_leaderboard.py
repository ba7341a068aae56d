"""The leaderboard in headless Chromium, on a phone and a desktop: a policy's own games only,
forks and people's games shown on marked rows when asked, every row's batches linked."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from rollouts.models import Episode, RolloutBatch
from rollouts.play.forks import episode_fork, fork_settings
from rollouts.recording import services
from rollouts.review.services import turn_relabel
from rollouts.rollout_settings import RolloutSettings
from rollouts.tests.helpers import record_batch
from tests.browser.support import screenshot_dir
from tests.browser.test_episode_viewer import _log_in_at, _user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SCREENSHOTS = screenshot_dir()


def _corrected_fork(*, of: Episode, turn: int, by) -> RolloutBatch:
    """A scripted fork of `of` at `turn` with a person's correction of that turn, played."""
    turn_relabel(turn=of.turns.get(index=turn), actions=["noop", "do"], reason="", user=by)
    settings = fork_settings(
        source=of, settings=RolloutSettings(policy="scripted", seeds=(of.seed,)), steps=None
    )
    fork = episode_fork(
        source=of, turn=turn, settings=settings, with_correction=True, enqueue=False
    )
    services.batch_play_inline(batch=fork.batch)
    batch = RolloutBatch.objects.get(id=fork.batch_id)
    assert batch.status == "finished", batch.error
    return batch


@pytest.mark.parametrize("width", [390, 1400])
def test_forks_and_peoples_games_stay_out_of_a_models_row(
    studio_page: Page, live_server, width: int
):
    own = record_batch(policy="scripted", seeds=(0, 1, 2), steps=60, name="own games")
    editor = _user("ranker", editor=True)
    fork = _corrected_fork(of=own.episodes.get(seed=1), turn=4, by=editor)
    human = RolloutBatch.objects.create(
        policy="human", seeds=[5], status="finished", image_size=own.image_size
    )
    Episode.objects.create(
        batch=human, seed=5, status="finished", steps=90, achievements={"collect_wood": 3}
    )
    page = studio_page
    page.set_viewport_size({"width": width, "height": 900})
    _log_in_at(page, live_server.url, "/leaderboard/", "ranker")

    board = page.locator("#leaderboard")
    own_row = board.locator("tbody tr[data-play=own]")
    expect(own_row).to_have_count(1)
    expect(own_row.locator("td").first).to_have_text("1")
    expect(own_row.locator(f"a[href='/rollouts/{own.id}/']")).to_have_text(f"#{own.id}")
    for other in (fork, human):
        expect(page.locator(f"main a[href='/rollouts/{other.id}/']")).to_have_count(0)
    expect(board.locator("tr.not-own")).to_have_count(0)
    _fits(page, width)

    page.click("#play-toggle")
    expect(page).to_have_url(f"{live_server.url}/leaderboard/?include=forks")
    expect(board.locator("tr.not-own")).to_have_count(2)
    fork_row = board.locator("tr[data-play=fork]")
    expect(fork_row.locator(".badge")).to_have_text("forks")
    expect(fork_row.locator("td").first).to_have_text("")  # marked, not ranked
    expect(fork_row.locator(f"a[href='/rollouts/{fork.id}/']")).to_have_text(f"#{fork.id}")
    human_row = board.locator("tr[data-play=human]")
    expect(human_row.locator(".badge")).to_have_text("people's games")
    expect(human_row.locator(f"a[href='/rollouts/{human.id}/']")).to_be_visible()
    # The model's own row is as it was: the fork is not pooled into it.
    expect(own_row.locator("td.batches a")).to_have_count(1)
    _fits(page, width)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"leaderboard-forks-{width}.png"), full_page=True)

    page.click("#play-toggle")
    expect(page).to_have_url(f"{live_server.url}/leaderboard/")
    expect(board.locator("tr.not-own")).to_have_count(0)


def _fits(page: Page, width: int) -> None:
    """The page does not scroll sideways (the table scrolls in its own box)."""
    assert page.evaluate("document.documentElement.scrollWidth") <= width


# The walkthrough's fine-tuned model and its base: the names that widened the table.
TUNED_MODEL = "ft:gpt-4o-2024-08-06:studio:crafter:walk1"
BASE_MODEL = "gpt-4o-2024-08-06"


@pytest.mark.parametrize("width", [390, 1400])
def test_every_column_heading_is_in_view_on_a_desktop_and_reachable_on_a_phone(
    studio_page: Page, live_server, width: int
):
    for model in (TUNED_MODEL, BASE_MODEL):
        for seeds in ((1, 3, 4), (5, 6, 7)):  # two batches pooled in each model's row
            batch = RolloutBatch.objects.create(
                policy="openai",
                model=model,
                seeds=list(seeds),
                status="finished",
                settings={"observation_mode": "image_text", "history_frames": 0},
            )
            Episode.objects.bulk_create(
                Episode(batch=batch, seed=s, status="finished", achievements={"collect_wood": 1})
                for s in seeds
            )
    record_batch(policy="scripted", seeds=(0, 1), steps=20)
    _user("ranker", editor=False)
    page = studio_page
    page.set_viewport_size({"width": width, "height": 900})
    _log_in_at(page, live_server.url, "/leaderboard/", "ranker")
    expect(page.locator("#leaderboard tbody tr[data-play=own]")).to_have_count(3)
    expect(page.locator(".topbar nav a[aria-current=page]")).to_have_text("Leaderboard")
    _fits(page, width)

    box = page.locator(".table-scroll:has(#leaderboard)")
    last = page.locator("#leaderboard thead th").last
    expect(last).to_have_text("Batches pooled")
    if width >= 1400:
        # The whole table in its box: no heading cut at the box's edge.
        sizes = box.evaluate("b => [b.scrollWidth, b.clientWidth]")
        assert sizes[0] <= sizes[1], f"the table is {sizes[0]} px wide in a {sizes[1]} px box"
    else:
        box.evaluate("b => { b.scrollLeft = b.scrollWidth; }")  # a phone scrolls the table
    inside = box.bounding_box()
    heading = last.bounding_box()
    assert heading["x"] + heading["width"] <= inside["x"] + inside["width"] + 1
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"leaderboard-models-{width}.png"), full_page=True)
