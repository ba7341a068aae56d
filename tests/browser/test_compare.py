"""Comparing two real batches in headless Debian Chromium: tick, compare, read, step a seed."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from rollouts.game.scoring import crafter_score
from rollouts.models import Episode
from rollouts.tests.helpers import record_batch
from tests.browser.support import screenshot_dir
from tests.browser.test_episode_viewer import _log_in_at, _user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SCREENSHOTS = screenshot_dir()


def test_it_compares_two_batches_ticked_in_the_batch_list(studio_page: Page, live_server):
    scripted = record_batch(policy="scripted", seeds=(0, 1, 2), steps=80, name="scripted run")
    rand = record_batch(policy="random", seeds=(1, 2, 3), steps=80, name="random run")
    _user("analyst", editor=False)
    page = studio_page
    _log_in_at(page, live_server.url, "/rollouts/", "analyst")
    page.check(f"#compare-{scripted.id}")
    page.check(f"#compare-{rand.id}")
    page.click("text=Compare selected")
    expect(page.locator("#shared-seeds")).to_contain_text("2 shared seeds")
    # The batches were ticked in the Rollouts list: its tab, not the leaderboard's, is lit.
    expect(page.locator(".topbar nav a[aria-current=page]")).to_have_text("Rollouts")

    # The summary table's scores are those of the episodes, counted here from the database.
    for row, batch in enumerate((scripted, rand)):
        episodes = Episode.objects.filter(batch=batch, seed__in=(1, 2))
        unlocked = [set(e.achievements) for e in episodes]
        rates = {n: 50.0 * sum(n in u for u in unlocked) for s in unlocked for n in s}
        cells = page.locator("#summary-table tbody tr").nth(row).locator("td")
        expect(cells.nth(0)).to_have_text("2")  # episodes on the shared seeds
        expect(cells.nth(1)).to_have_text("0")  # failed
        expect(cells.nth(3)).to_have_text(f"{crafter_score(rates):.2f}%")
    expect(page.locator("#summary-table tr.diff")).to_contain_text("2 paired seeds")
    expect(page.locator("#rates-table tbody tr")).to_have_count(22)
    expect(page.locator("svg.chart-wide")).to_have_count(2)
    expect(page.locator("svg.chart-narrow")).to_have_count(2)
    expect(page.locator("svg.chart-narrow").first).to_be_hidden()  # the phone's layout
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "compare.png"), full_page=True)

    # A seed's episodes side by side, stepped together with the keyboard.
    page.click("#seed-table a:text-is('2')")
    expect(page.locator("h1")).to_have_text("Seed 2 side by side")
    expect(page.locator(".topbar nav a[aria-current=page]")).to_have_text("Rollouts")
    frames = page.locator("img.seed-frame")
    expect(frames).to_have_count(2)
    scripted_episode = Episode.objects.get(batch=scripted, seed=2)
    shas = list(scripted_episode.frames.order_by("step").values_list("sha256", flat=True))
    expect(frames.nth(0)).to_have_attribute("src", f"/frames/{shas[0]}.png")
    page.keyboard.press("ArrowRight")
    expect(page.locator("#step-value")).to_have_text("1")
    expect(frames.nth(0)).to_have_attribute("src", f"/frames/{shas[1]}.png")
    page.keyboard.press("End")
    expect(page.locator("#step-value")).to_have_text(str(len(shas) - 1))
    expect(frames.nth(0)).to_have_attribute("src", f"/frames/{shas[-1]}.png")
    page.keyboard.press("Home")
    page.keyboard.press("ArrowRight")
    expect(page.locator(".viewer-link").nth(0)).to_have_attribute(
        "href", f"/episodes/{scripted_episode.id}/?turn=1"
    )
    page.screenshot(path=str(SCREENSHOTS / "compare-seed.png"), full_page=True)


def test_the_comparison_fits_a_phone(studio_page: Page, live_server):
    one = record_batch(policy="scripted", seeds=(0, 1), steps=30)
    two = record_batch(policy="random", seeds=(0, 1), steps=30)
    _user("phone", editor=False)
    page = studio_page
    page.set_viewport_size({"width": 360, "height": 740})
    _log_in_at(page, live_server.url, "/leaderboard/", "phone")
    page.goto(f"{live_server.url}/compare/?batches={one.id},{two.id}")
    expect(page.locator("#shared-seeds")).to_contain_text("2 shared seeds")
    # Wide tables scroll inside their card; the page itself does not scroll sideways.
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 360, width
    page.goto(live_server.url + "/leaderboard/")
    expect(page.locator("#leaderboard")).to_contain_text("Human experts")
    assert page.evaluate("document.documentElement.scrollWidth") <= 360
    page.screenshot(path=str(SCREENSHOTS / "leaderboard-phone.png"), full_page=True)


# Each chart drawn on the page, as shown: its box, and the size and box of its texts.
_CHARTS_SHOWN = """() => [...document.querySelectorAll('svg.chart')]
  .filter(svg => svg.getBoundingClientRect().width > 0)
  .map(svg => {
    const box = svg.getBoundingClientRect();
    const texts = [...svg.querySelectorAll('text')].map(text => {
      const r = text.getBoundingClientRect();
      return {
        text: text.textContent,
        px: parseFloat(getComputedStyle(text).fontSize) * text.getScreenCTM().a,
        left: r.left, right: r.right,
      };
    });
    return {top: box.top, bottom: box.bottom, left: box.left, right: box.right, texts};
  })"""


@pytest.mark.parametrize("width", [390, 1400])
def test_the_compare_charts_are_readable_on_a_phone_and_a_desktop(
    studio_page: Page, live_server, width: int
):
    one = record_batch(policy="scripted", seeds=(0, 1, 2), steps=60, name="a scripted run, named")
    two = record_batch(policy="random", seeds=(0, 1, 2), steps=60, name="random walk of a baseline")
    _user("reader", editor=False)
    page = studio_page
    page.set_viewport_size({"width": width, "height": 900})
    _log_in_at(page, live_server.url, "/leaderboard/", "reader")
    page.goto(f"{live_server.url}/compare/?batches={one.id},{two.id}")
    expect(page.locator("#shared-seeds")).to_contain_text("3 shared seeds")

    assert page.evaluate("document.documentElement.scrollWidth") <= width
    score, rates = page.evaluate(_CHARTS_SHOWN)  # one layout of each chart is shown
    # One column: the rates chart below the score chart, from the same left edge.
    assert rates["top"] >= score["bottom"] and abs(rates["left"] - score["left"]) < 1
    for chart in (score, rates):
        assert chart["right"] <= width
        for text in chart["texts"]:
            assert text["px"] >= 11, (width, text)
            # Nothing cut off at the chart's edges.
            assert chart["left"] - 1 <= text["left"] <= text["right"] <= chart["right"] + 1, text
    labels = {text["text"] for text in rates["texts"]}
    assert {"collect_wood", "eat_plant", f"#{one.id} a scripted run, named"} <= labels
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.locator(".compare-charts").screenshot(
        path=str(SCREENSHOTS / f"compare-charts-{width}.png")
    )
