"""The episode viewer in headless Debian Chromium, against a live server: keys, flag, note.

Playwright's sync API runs an event loop in this thread, so Django's ORM calls made here
need DJANGO_ALLOW_ASYNC_UNSAFE (set for these tests only). Never downloads a browser.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from playwright.sync_api import Page, expect

from rollouts.models import Episode, Turn
from rollouts.recording import services
from rollouts.rollout_settings import RolloutSettings

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
# The README's screenshot is rewritten only when asked (UPDATE_SCREENSHOTS=1), so that a test
# run leaves the checkout as it found it; otherwise the screenshot goes under var/.
SCREENSHOT = (
    ROOT / "docs" / "screenshots" / "episode-viewer.png"
    if os.environ.get("UPDATE_SCREENSHOTS") == "1"
    else ROOT / "var" / "screenshots" / "episode-viewer.png"
)


def _user(username: str, *, editor: bool) -> User:
    user = User.objects.create_user(username, password=f"{username}-pass-123")
    if editor:
        user.user_permissions.add(Permission.objects.get(codename="review_turn"))
    return user


def _played_episode(*, steps: int, seed: int = 1) -> Episode:
    batch = services.batch_run_inline(
        settings=RolloutSettings(policy="scripted", seeds=(seed,), steps=steps, name="tour")
    )
    episode = batch.episodes.get()
    assert episode.status == Episode.Status.FINISHED, episode.error
    return episode


def _log_in_at(page: Page, base_url: str, path: str, username: str) -> None:
    page.goto(base_url + path)
    expect(page).to_have_url(f"{base_url}/login/?next={path}")
    page.fill("#id_username", username)
    page.fill("#id_password", f"{username}-pass-123")
    page.click("main button[type=submit]")
    expect(page).to_have_url(base_url + path)


def _log_in(page: Page, base_url: str, path: str, username: str) -> None:
    page.goto(base_url + path)
    expect(page).to_have_url(f"{base_url}/login/?next={path}")
    page.fill("#id_username", username)
    page.fill("#id_password", f"{username}-pass-123")
    page.click("main button[type=submit]")
    # The viewer keeps the turn at the cursor in the address: ?turn=0 on arrival.
    expect(page).to_have_url(f"{base_url}{path}?turn=0")


def test_it_flags_the_next_turn_with_keys_and_stores_it(studio_page: Page, live_server):
    page = studio_page
    _user("reviewer", editor=True)
    episode = _played_episode(steps=40)
    Turn.objects.filter(episode=episode, index=2).update(
        model_text='<img src=x onerror="window.pwned=1"> I will chop the tree.'
    )
    turn_count = episode.turns.count()
    path = f"/episodes/{episode.id}/"
    _log_in(page, live_server.url, path, "reviewer")
    position = page.locator("#turn-pos")
    expect(position).to_have_text(f"1 / {turn_count}")

    page.keyboard.press("ArrowRight")
    expect(position).to_have_text(f"2 / {turn_count}")
    with page.expect_response(
        lambda r: r.request.method == "POST" and "/flag/" in r.url
    ) as flag_response:
        page.keyboard.press("f")
    assert flag_response.value.status == 200
    expect(page.locator("#flag-button")).to_have_attribute("aria-pressed", "true")
    assert list(
        Turn.objects.filter(episode=episode, flagged=True).values_list("index", flat=True)
    ) == [1]

    page.keyboard.press("n")
    page.keyboard.type("Walks into the tree instead of chopping it.")
    with page.expect_response(lambda r: "/note/" in r.url) as note_response:
        page.keyboard.press("Control+Enter")
    assert note_response.value.status == 200
    turn = Turn.objects.get(episode=episode, index=1)
    assert turn.note == "Walks into the tree instead of chopping it."
    page.keyboard.press("Escape")

    # Model output is shown as text, never run.
    page.keyboard.press("ArrowRight")
    model_text = page.locator('[data-field="model_text"]')
    expect(model_text).to_contain_text('<img src=x onerror="window.pwned=1">')
    assert page.evaluate("window.pwned") is None

    page.keyboard.press("?")
    expect(page.locator("#help")).to_be_visible()
    page.keyboard.press("Escape")
    expect(page.locator("#help")).to_be_hidden()

    page.keyboard.press("ArrowLeft")
    expect(position).to_have_text(f"2 / {turn_count}")
    expect(page.locator("#note")).to_have_value("Walks into the tree instead of chopping it.")
    page.wait_for_load_state("networkidle")
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT))
    # A screenshot of the whole viewport with the game frames in it, not a blank or error
    # page (a few flat colours): Crafter's textures alone bring hundreds of colours.
    from PIL import Image

    with Image.open(SCREENSHOT) as shot:
        assert shot.size == (1400, 900)
        assert len(shot.convert("RGB").getcolors(maxcolors=1_000_000)) > 300


def test_it_lets_a_viewer_look_but_not_flag(studio_page: Page, live_server):
    page = studio_page
    _user("looker", editor=False)
    episode = _played_episode(steps=8, seed=2)
    path = f"/episodes/{episode.id}/"
    _log_in(page, live_server.url, path, "looker")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("f")
    expect(page.locator("#review-status")).to_contain_text("needs the review permission")
    expect(page.locator("#flag-button")).to_have_count(0)
    assert not Turn.objects.filter(flagged=True).exists()


def test_it_flags_from_the_turn_list_and_in_bulk(studio_page: Page, live_server, celery_worker):
    page = studio_page
    _user("curator", editor=True)
    episode = _played_episode(steps=60, seed=3)
    other = _played_episode(steps=4, seed=4)
    _log_in_at(page, live_server.url, "/turns/", "curator")

    first_flag = page.locator("tbody tr").first.locator("button.flag-toggle")
    with page.expect_response(lambda r: "/flag/" in r.url) as response:
        first_flag.click()
    assert response.value.status == 200
    expect(page.locator("tbody tr").first.locator("button.flag-toggle")).to_have_text("⚑ flagged")
    # Newest episode first: the first row is turn 0 of the last episode played.
    assert list(Turn.objects.filter(flagged=True).values_list("episode_id", "index")) == [
        (other.id, 0)
    ]

    page.select_option("select[name=batch]", str(episode.batch_id))
    page.click("form.filters button[type=submit]")
    page.click("text=Flag all 60")
    expect(page.locator("h1")).to_have_text("Flag 60 turns?")
    page.click("main button[type=submit]")
    # The worker flags them; the progress page polls until it says so.
    expect(page.locator("#bulk-flag-progress")).to_contain_text("Flagged 60 turns.")
    assert episode.turns.filter(flagged=True).count() == 60
    assert other.turns.filter(flagged=True).count() == 1  # outside the filter: untouched


def test_it_loads_each_turns_text_as_the_cursor_moves_and_after_a_far_jump(
    studio_page: Page, live_server
):
    from rollouts.tests.helpers import seed_episode

    page = studio_page
    _user("walker", editor=False)
    turns = 1500
    episode = seed_episode(turns=turns, observation="Seen at {i}.", model_text="Said at {i}.")
    path = f"/episodes/{episode.id}/"
    _log_in(page, live_server.url, path, "walker")
    position = page.locator("#turn-pos")
    model_text = page.locator('[data-field="model_text"]')
    observation = page.locator('[data-field="observation"]')
    expect(model_text).to_have_text("Said at 0.")
    for i in range(1, 6):
        page.keyboard.press("ArrowRight")
        expect(position).to_have_text(f"{i + 1} / {turns}")
        expect(model_text).to_have_text(f"Said at {i}.")
        expect(observation).to_have_text(f"Seen at {i}.")
    page.keyboard.press("End")
    expect(position).to_have_text(f"{turns} / {turns}")
    expect(model_text).to_have_text(f"Said at {turns - 1}.")
    page.keyboard.press("ArrowLeft")
    expect(model_text).to_have_text(f"Said at {turns - 2}.")
    # The filmstrip holds the turns around the cursor, not 1,500 thumbnails.
    assert 0 < page.locator("#filmstrip .thumb").count() <= 81
    expect(page.locator("#filmstrip .thumb.current")).to_have_attribute("data-i", str(turns - 2))

    page.goto(f"{live_server.url}{path}?turn=1234")
    expect(position).to_have_text(f"1235 / {turns}")
    expect(model_text).to_have_text("Said at 1234.")
    expect(observation).to_have_text("Seen at 1234.")
    # Its neighbours were fetched ahead: the next key press shows the turn with no request.
    page.wait_for_load_state("networkidle")
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url))
    page.keyboard.press("ArrowRight")
    expect(model_text).to_have_text("Said at 1235.")
    assert not [url for url in asked if url.endswith("/turns/1235/")], asked
    page.keyboard.press("Home")
    expect(model_text).to_have_text("Said at 0.")
