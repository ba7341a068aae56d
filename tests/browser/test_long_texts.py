"""A long model text in the viewer: its start at once, the rest with one click."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from rollouts.models import Turn
from tests.browser.test_episode_viewer import _log_in, _played_episode, _user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_it_loads_the_rest_of_a_long_text_on_request(request, live_server):
    page: Page = request.getfixturevalue("studio_page")
    _user("reader", editor=False)
    episode = _played_episode(steps=3, seed=5)
    Turn.objects.filter(episode=episode, index=0).update(model_text="A" * 5000 + " <b>END</b>")
    _log_in(page, live_server.url, f"/episodes/{episode.id}/", "reader")
    model_text = page.locator('[data-field="model_text"]')
    expect(model_text).to_have_text("A" * 2000 + "…")
    button = page.locator("button.load-rest")
    expect(button).to_have_text("Show all (5011 characters)")
    button.click()
    expect(model_text).to_have_text("A" * 5000 + " <b>END</b>")  # as text, never as HTML
    expect(button).to_have_count(0)
    page.keyboard.press("ArrowRight")  # a short turn: nothing to load
    expect(page.locator("button.load-rest")).to_have_count(0)
