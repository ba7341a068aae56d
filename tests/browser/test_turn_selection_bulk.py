"""Ticking turns on the turn list in headless Debian Chromium, on a 390 px phone and a
1,400 px screen: shift-click (and shift+space) ranges, the page's box, "select all N
matching", and the bar's actions confirmed with their count (a note on the ticked turns;
every matching turn added to a dataset)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from curation import services as dataset_services
from curation.export_options import ExportOptions
from curation.models import Dataset
from rollouts.models import Turn
from rollouts.review.turn_selection import TurnSelection
from rollouts.tests.helpers import record_batch
from tests.browser.support import screenshot_dir
from tests.browser.test_episode_viewer import _log_in_at, _user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# docs/review.md shows the 1,400 px one, rewritten only when asked (UPDATE_SCREENSHOTS=1) so
# that a test run leaves the checkout as it found it; the rest go under var/.
DOCS_WIDTH = 1400


def _screenshot_path(width: int) -> Path:
    return screenshot_dir(docs=width == DOCS_WIDTH) / f"turn-selection-{width}.png"


def _fits(page: Page) -> None:
    """The page never scrolls sideways (the table scrolls in its own box)."""
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= page.evaluate("window.innerWidth"), f"the page is {width} px wide"


@pytest.mark.parametrize("width", [390, 1400])
def test_it_ticks_ranges_and_every_match_and_acts_on_them(studio_page: Page, live_server, width):
    page = studio_page
    page.set_viewport_size({"width": width, "height": 900})
    tour = record_batch(seeds=(3, 4), steps=35, name="tour")  # 70 turns: two pages
    other = record_batch(seeds=(5,), steps=5, name="other")
    dataset = dataset_services.dataset_create(
        name="picked by hand", filters=TurnSelection(batches=(other.id,)), options=ExportOptions()
    )
    _user("curator", editor=True)
    _log_in_at(page, live_server.url, "/turns/", "curator")
    page.select_option("select[name=batch]", str(tour.id))
    page.click("form.filters button[type=submit]")

    bar = page.locator("#turn-bulk")
    status = bar.locator("[data-selected-count]")
    boxes = page.locator('tbody input[name="turn"]')
    expect(boxes).to_have_count(50)
    expect(status).to_have_text("No turn ticked")
    expect(bar.locator('button[name="action"][value="note"]')).to_be_disabled()
    _fits(page)

    # A click, then a shift-click: the range between them.
    boxes.nth(2).click()
    boxes.nth(6).click(modifiers=["Shift"])
    expect(status).to_have_text("5 turns ticked")
    for i in range(2, 7):
        expect(boxes.nth(i)).to_be_checked()
    expect(boxes.nth(1)).not_to_be_checked()
    expect(boxes.nth(7)).not_to_be_checked()
    # Shift-click unticking from there back to 5: 5 and 6 untick, 2-4 stay.
    boxes.nth(5).click(modifiers=["Shift"])
    expect(status).to_have_text("3 turns ticked")
    # The keyboard: space ticks one, shift+space the range from it.
    boxes.nth(10).focus()
    page.keyboard.press("Space")
    boxes.nth(12).focus()
    page.keyboard.press("Shift+Space")
    expect(status).to_have_text("6 turns ticked")
    expect(page.locator("[data-select-page]")).to_have_js_property("indeterminate", True)
    ticked = [int(boxes.nth(i).get_attribute("value")) for i in (2, 3, 4, 10, 11, 12)]
    assert [i for i in range(50) if boxes.nth(i).is_checked()] == [2, 3, 4, 10, 11, 12]
    _fits(page)
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(_screenshot_path(width)))

    # A note on the ticked turns, confirmed with their count.
    bar.locator('button[name="action"][value="note"]').click()
    expect(page.locator("h1")).to_have_text("Set a note on 6 turns?")
    _fits(page)
    page.fill("textarea[name=note]", "walks into the water")
    page.click("#bulk-confirm button[type=submit]")
    expect(page.locator(".messages")).to_contain_text("Note set on 6 turns.")
    expect(page).to_have_url(re.compile(rf"/turns/\?batch={tour.id}(&|$)"))
    noted = Turn.objects.filter(note="walks into the water")
    assert sorted(noted.values_list("id", flat=True)) == sorted(ticked)

    # The page's box, then every turn that matches, on every page.
    expect(status).to_have_text("No turn ticked")
    select_all = bar.locator("[data-select-all]")
    expect(select_all).to_be_hidden()
    page.locator("[data-select-page]").check()
    expect(status).to_have_text("50 turns ticked")
    expect(select_all).to_have_text("Select all 70 matching")
    select_all.click()
    expect(status).to_have_text("All 70 matching turns selected")
    expect(select_all).to_be_hidden()
    # Unticking a row by hand goes back to the ticked turns.
    boxes.nth(0).click()
    expect(status).to_have_text("49 turns ticked")
    page.locator("[data-select-page]").check()
    select_all.click()
    bar.locator('button[name="action"][value="dataset"]').click()
    expect(page.locator("h1")).to_have_text("Add 70 turns to a dataset?")
    expect(page.locator("#bulk-confirm")).to_contain_text(f"batch: {tour.id}")
    _fits(page)
    page.select_option("select[name=target]", str(dataset.id))
    page.click("#bulk-confirm button[type=submit]")
    expect(page.locator(".messages")).to_contain_text("Added 70 turns to dataset 'picked by hand'.")
    included = TurnSelection.from_json(Dataset.objects.get().filters).include_turns
    assert set(included) == set(
        Turn.objects.filter(episode__batch=tour).values_list("id", flat=True)
    )

    # Clear leaves nothing ticked and the actions off.
    page.locator("[data-select-page]").check()
    bar.locator("[data-clear]").click()
    expect(status).to_have_text("No turn ticked")
    expect(bar.locator('button[name="action"][value="flag"]')).to_be_disabled()
