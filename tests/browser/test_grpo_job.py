"""A GRPO job's page in headless Chromium: the reinforcement-learning card, its table and its
two charts drawn from the iterations' rows, at a desk's width and a phone's."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from tests.browser.support import screenshot_dir
from training.models import GrpoIteration
from training.tests.test_grpo_page import grpo_job, three_iterations

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
VIEWPORT = {"width": 1400, "height": 900}
SCREENSHOT = screenshot_dir() / "grpo-job.png"


def test_the_card_draws_each_iteration_at_any_width(studio_page: Page, live_server):
    page = studio_page
    job = grpo_job()
    three_iterations(job)
    # The pages' test names an achievement in markup to check it is escaped; the picture
    # shows what a run writes.
    GrpoIteration.objects.filter(job=job, number=1).update(
        success_rates={"collect_wood": 75.0, "place_table": 12.5, "wake_up": 50.0}
    )
    User.objects.create_user("rl-watcher", password="rl-watcher-pass-1")
    path = f"/training/{job.id}/"
    page.goto(live_server.url + path)
    page.fill("#id_username", "rl-watcher")
    page.fill("#id_password", "rl-watcher-pass-1")
    page.click("main button[type=submit]")
    expect(page).to_have_url(live_server.url + path)

    card = page.locator("#grpo")
    expect(card.locator("#grpo-reward")).to_have_text("crafter")
    expect(card.locator("#grpo-iterations")).to_have_text(
        "2 done of 10"
    )  # the third is still playing
    expect(card.locator("table tbody tr")).to_have_count(3)
    reward_chart = card.locator("#grpo-reward-chart")
    expect(reward_chart).to_be_visible()
    # Three iterations' means: a line of three points in its interval's band.
    expect(reward_chart.locator("polyline")).to_have_count(1)
    assert reward_chart.locator("polyline").get_attribute("points").count(",") == 3
    expect(card.locator("#grpo-update-chart")).to_be_visible()
    card.screenshot(path=str(SCREENSHOT))

    page.set_viewport_size({"width": 390, "height": 844})
    expect(reward_chart).to_be_visible()
    box = reward_chart.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390
    scroll_width = page.evaluate("document.documentElement.scrollWidth")
    assert scroll_width <= 390, f"the page is {scroll_width} px wide on a phone"
