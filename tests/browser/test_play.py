"""Playing Crafter in headless Chromium, and the episode viewer's new keys at 800 px.

The personas and log-in steps come from test_episode_viewer; the browser from conftest.
"""

from __future__ import annotations

import hashlib

import pytest
from django.core.cache import cache
from playwright.sync_api import Page, expect

from rollouts.game.crafter_env import ACTION_INDEX, KEY_MAP, StudioEnv, encode_png
from rollouts.models import Episode, RolloutBatch, TurnRelabel
from tests.browser.support import screenshot_dir
from tests.browser.test_episode_viewer import ROOT, _log_in, _log_in_at, _played_episode, _user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
# Each key press is a request that writes to PostgreSQL: on a loaded shared machine a few
# take longer than Playwright's default 5 s wait.
expect.set_options(timeout=20_000)

SCREENSHOT = screenshot_dir() / "play.png"
BROWSER_KEY = {" ": "Space", "Tab": "Tab"}
# 30 presses: walk to things, hit them, place a table, sleep a little.
ACTIONS = (
    ["move_left"] * 3
    + ["do"] * 4
    + ["move_up", "move_up", "do", "do", "noop", "move_right", "do", "do"]
    + ["place_table", "make_wood_pickaxe", "move_down", "move_down", "do", "sleep", "noop"]
    + ["move_right", "move_right", "do", "place_stone", "place_plant", "do", "noop", "do"]
)
assert len(ACTIONS) == 30


def _key(action: str) -> str:
    key = {a: k for k, a in KEY_MAP}[action]
    return BROWSER_KEY.get(key, key)


def _inline_hashes(actions, *, seed: int, steps: int) -> list[str]:
    env = StudioEnv(seed=seed, size=64, length=steps)
    frames = [env.reset()]
    for action in actions:
        frames.append(env.step(ACTION_INDEX[action])[0])
    return [hashlib.sha256(encode_png(f).png).hexdigest() for f in frames]


def test_it_plays_30_keys_and_records_the_frames_of_an_inline_replay(
    studio_page: Page, live_server
):
    page = studio_page
    _user("player", editor=True)
    _log_in_at(page, live_server.url, "/play/new/", "player")
    page.fill("#id_seed", "98")  # a seed where these keys collect wood and a sapling
    page.fill("#id_steps", "400")
    page.click("main button[type=submit]")
    expect(page.locator("#play-status")).to_have_text("running")
    # play.js has drawn the game (and listens to keys) once the body carries the turn count.
    expect(page.locator("body")).to_have_attribute("data-turns", "0")
    episode = Episode.objects.get(batch__policy=RolloutBatch.Policy.HUMAN)
    for n, action in enumerate(ACTIONS, start=1):
        page.keyboard.press(_key(action))
        expect(page.locator("body")).to_have_attribute("data-turns", str(n))
        if n == 17:
            cache.clear()  # the server forgets the game mid-play: it is replayed
    expect(page.locator("#play-step")).to_have_text("30")
    recorded = list(episode.frames.order_by("step").values_list("sha256", flat=True))
    assert recorded == _inline_hashes(ACTIONS, seed=98, steps=400)
    assert list(episode.turns.order_by("index").values_list("actions", flat=True)) == [
        [a] for a in ACTIONS
    ]
    expect(page.locator("#play-vitals [data-vital=health]")).to_have_text(
        str(episode.frames.get(step=30).state["vitals"]["health"])
    )
    expect(page.locator("#play-frame")).to_have_attribute("src", f"/frames/{recorded[-1]}.png")
    # The same key sent twice at once (a retried request): one turn, one step.
    statuses = page.evaluate(
        """async () => {
            const config = JSON.parse(document.getElementById("play-config").textContent);
            const send = () => fetch(config.stepUrl, {
                method: "POST",
                headers: {"X-CSRFToken": config.csrf,
                          "Content-Type": "application/x-www-form-urlencoded"},
                body: "action=do&turn=30",
            }).then((r) => r.json());
            const answers = await Promise.all([send(), send()]);
            return answers.map((a) => [a.turns, a.duplicate]);
        }"""
    )
    assert sorted(statuses) == [[31, False], [31, True]]
    assert episode.turns.count() == 31 and episode.frames.count() == 32
    page.reload()
    expect(page.locator("#play-step")).to_have_text("31")
    page.wait_for_load_state("networkidle")
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT))
    assert SCREENSHOT.stat().st_size > 10_000
    page.click("#end-game")
    expect(page).to_have_url(f"{live_server.url}/episodes/{episode.id}/?turn=0")
    episode.refresh_from_db()
    assert episode.status == Episode.Status.FINISHED


def test_the_viewer_fits_800_px_and_its_keys_move_by_kind_and_relabel(
    studio_page: Page, live_server
):
    page = studio_page
    page.set_viewport_size({"width": 800, "height": 900})
    _user("reviewer", editor=True)
    episode = _played_episode(steps=256, seed=0)  # long: a wide filmstrip
    episode.turns.filter(index__in=[30, 90]).update(flagged=True)
    episode.turns.filter(index=60).update(error="boom", error_kind="timeout")
    n = episode.turns.count()
    first_unlock = min(t.index for t in episode.turns.all() if t.achievements_unlocked)
    path = f"/episodes/{episode.id}/"
    _log_in(page, live_server.url, path, "reviewer")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 800, f"the page scrolls sideways: {width} px"
    position = page.locator("#turn-pos")
    page.keyboard.press("]")
    expect(position).to_have_text(f"31 / {n}")
    page.keyboard.press("]")
    expect(position).to_have_text(f"91 / {n}")
    page.keyboard.press("[")
    expect(position).to_have_text(f"31 / {n}")
    page.keyboard.press("e")
    expect(position).to_have_text(f"61 / {n}")
    page.keyboard.press("Home")
    page.keyboard.press("a")
    expect(position).to_have_text(f"{first_unlock + 1} / {n}")
    # The chart's cursor sits on the turn at the cursor.
    x = float(page.locator("#chart-cursor").get_attribute("x1"))
    expected = 18 + first_unlock / (n - 1) * (400 - 18 - 30)
    assert abs(x - expected) < 0.2
    assert page.locator("#chart polyline").count() == 5
    page.keyboard.press("z")
    expect(page.locator("#zoom")).to_be_visible()
    page.keyboard.press("Escape")
    expect(page.locator("#zoom")).to_be_hidden()

    # Relabel with the play keys: T (place_table), Space (do), Enter saves.
    page.keyboard.press("Home")
    page.keyboard.press("r")
    expect(page.locator("#relabel-editor")).to_be_visible()
    page.keyboard.press("t")
    page.keyboard.press("Space")
    expect(page.locator("#relabel-picked .chip")).to_have_count(2)
    with page.expect_response(lambda r: "/relabel/" in r.url) as response:
        page.keyboard.press("Enter")
    assert response.value.status == 200
    relabel = TurnRelabel.objects.get(turn__episode=episode, turn__index=0)
    assert relabel.actions == ["place_table", "do"]
    expect(page.locator('[data-field="relabel"] .chip')).to_have_count(2)
    assert page.evaluate("document.documentElement.scrollWidth") <= 800

    page.screenshot(path=str(ROOT / "var" / "screenshots" / "episode-viewer-800.png"))

    # The same page at 360 px: still no sideways scroll.
    page.set_viewport_size({"width": 360, "height": 800})
    assert page.evaluate("document.documentElement.scrollWidth") <= 360
    page.screenshot(path=str(ROOT / "var" / "screenshots" / "episode-viewer-360.png"))


@pytest.mark.parametrize("width", [390, 1400])
def test_a_game_that_has_ended_offers_no_end_button(studio_page: Page, live_server, width):
    page = studio_page
    page.set_viewport_size({"width": width, "height": 900})
    _user("player", editor=True)
    _log_in_at(page, live_server.url, "/play/new/", "player")
    page.fill("#id_seed", "5")
    page.fill("#id_steps", "3")
    page.click("main button[type=submit]")
    expect(page.locator("body")).to_have_attribute("data-turns", "0")
    expect(page.locator("#end-game")).to_be_visible()
    for n in range(1, 4):
        page.keyboard.press(_key("noop"))
        expect(page.locator("body")).to_have_attribute("data-turns", str(n))
    # The third key was the last step: the game ended under the player's hands.
    expect(page.locator("#play-status")).to_have_text("finished")
    expect(page.locator("#end-game")).to_be_hidden()
    page.reload()
    expect(page.locator("#play-status")).to_have_text("finished")
    expect(page.locator("#end-game")).to_have_count(0)

    # Ended with the button, then Back to the game: the page is asked for again, not shown
    # as the browser kept it (a running game with the button).
    page.goto(live_server.url + "/play/new/")
    page.fill("#id_seed", "6")
    page.fill("#id_steps", "50")
    page.click("main button[type=submit]")
    expect(page.locator("body")).to_have_attribute("data-turns", "0")
    page.keyboard.press(_key("noop"))
    expect(page.locator("body")).to_have_attribute("data-turns", "1")
    page.click("#end-game")
    expect(page.locator("#review-status, #turn-pos").first).to_be_attached()
    page.go_back()
    expect(page.locator("#play-status")).to_have_text("finished")
    expect(page.locator("#end-game")).to_have_count(0)
    assert page.evaluate("document.documentElement.scrollWidth") <= width
