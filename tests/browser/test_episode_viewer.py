"""The episode viewer in headless Debian Chromium, against a live server: keys, flag, note.

Playwright's sync API runs an event loop in this thread, so Django's ORM calls made here
need DJANGO_ALLOW_ASYNC_UNSAFE (set for these tests only). Never downloads a browser.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from playwright.sync_api import Page, expect

from rollouts.models import Episode, Turn, TurnRelabel
from rollouts.recording import services
from rollouts.rollout_settings import RolloutSettings
from tests.browser.support import screenshot_dir

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = screenshot_dir() / "episode-viewer.png"


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


# What a new user walks through at a phone's width and a desktop's.
WIDTHS = [390, 1400]


def _fits(page: Page, width: int) -> None:
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"the page scrolls sideways at {width} px: {scroll} px wide"


@pytest.mark.parametrize("width", WIDTHS)
def test_a_note_saved_with_ctrl_enter_gives_the_keys_back_to_the_viewer(
    studio_page: Page, live_server, width: int
):
    page = studio_page
    page.set_viewport_size({"width": width, "height": 900})
    _user("reviewer", editor=True)
    episode = _played_episode(steps=12, seed=5)
    turn_count = episode.turns.count()
    _log_in(page, live_server.url, f"/episodes/{episode.id}/", "reviewer")
    page.keyboard.press("ArrowRight")
    expect(page.locator("#turn-pos")).to_have_text(f"2 / {turn_count}")
    note = page.locator("#note")
    expect(note).to_be_enabled()  # the turn's note is here
    page.keyboard.press("n")
    expect(note).to_be_focused()
    page.keyboard.type("Walks past the tree.")
    with page.expect_response(lambda r: "/note/" in r.url) as saved:
        page.keyboard.press("Control+Enter")
    assert saved.value.status == 200
    expect(page.locator("#review-status")).to_have_text("saved")
    expect(note).not_to_be_focused()

    # The next keys are the viewer's again: r relabels, then a, a, Space pick three actions.
    for key in ("r", "a", "a", "Space"):
        page.keyboard.press(key)
    picked = page.locator("#relabel-picked .chip")
    expect(picked).to_have_text(["move_left", "move_left", "do"])
    with page.expect_response(lambda r: "/relabel/" in r.url) as relabeled:
        page.keyboard.press("Enter")
    assert relabeled.value.status == 200
    correction = page.locator('[data-field="relabel"] .chip')
    expect(correction).to_have_text(["move_left", "move_left", "do"])
    expect(note).to_have_value("Walks past the tree.")
    turn = Turn.objects.get(episode=episode, index=1)
    assert turn.note == "Walks past the tree."
    assert TurnRelabel.objects.get(turn=turn).actions == ["move_left", "move_left", "do"]


@pytest.mark.parametrize("width", WIDTHS)
def test_r_on_a_corrected_turn_shows_the_saved_correction_and_replaces_it(
    studio_page: Page, live_server, width: int
):
    from rollouts.review.services import turn_relabel

    page = studio_page
    page.set_viewport_size({"width": width, "height": 900})
    reviewer = _user("reviewer", editor=True)
    episode = _played_episode(steps=12, seed=5)
    turn = Turn.objects.get(episode=episode, index=1)
    turn_relabel(turn=turn, actions=["move_left", "move_left", "do"], reason="tree", user=reviewer)
    _log_in(page, live_server.url, f"/episodes/{episode.id}/", "reviewer")
    page.keyboard.press("ArrowRight")
    correction = page.locator('[data-field="relabel"] .chip')
    expect(correction).to_have_text(["move_left", "move_left", "do"])

    # The saved correction is shown as such; the keys pick what replaces it.
    picked = page.locator("#relabel-picked .chip")
    page.keyboard.press("r")
    expect(page.locator("#relabel-editor")).to_be_visible()
    expect(picked).to_have_count(0)
    expect(page.locator("#relabel-saved")).to_be_visible()
    expect(page.locator("#relabel-saved-actions .chip")).to_have_text(
        ["move_left", "move_left", "do"]
    )
    expect(page.locator("#relabel-save")).to_have_text("Replace correction")
    page.keyboard.press("t")
    page.keyboard.press("Space")
    expect(picked).to_have_text(["place_table", "do"])
    _fits(page, width)
    page.screenshot(path=str(ROOT / "var" / "screenshots" / f"episode-viewer-relabel-{width}.png"))
    with page.expect_response(lambda r: "/relabel/" in r.url) as replaced:
        page.keyboard.press("Enter")
    assert replaced.value.status == 200
    expect(correction).to_have_text(["place_table", "do"])
    assert TurnRelabel.objects.get(turn=turn).actions == ["place_table", "do"]

    # Adding to it is asked for: "Start from it" puts the saved actions back in the picks.
    page.keyboard.press("r")
    page.click("#relabel-extend")
    page.keyboard.press("n")
    expect(picked).to_have_text(["place_table", "do", "noop"])
    page.keyboard.press("Escape")
    expect(page.locator("#relabel-editor")).to_be_hidden()
    assert TurnRelabel.objects.get(turn=turn).actions == ["place_table", "do"]


def _tool_call(arguments: str) -> list[dict]:
    function = {"name": "interact_many", "arguments": arguments}
    return [{"id": "call_1", "type": "function", "function": function}]


@pytest.mark.parametrize("width", WIDTHS)
def test_tool_call_arguments_show_as_indented_json_and_malformed_ones_as_sent(
    studio_page: Page, live_server, width: int
):
    page = studio_page
    page.set_viewport_size({"width": width, "height": 900})
    _user("reader", editor=False)
    episode = _played_episode(steps=6, seed=6)
    malformed = '{"actions": ["do"], "why": "<img src=x onerror=\\"window.pwned=1\\">"'
    long = json.dumps({"actions": ["noop"], "pad": "x" * 3000})
    for index, arguments in enumerate(['{"actions":["move_left","do"]}', malformed, long]):
        Turn.objects.filter(episode=episode, index=index).update(tool_calls=_tool_call(arguments))
    _log_in(page, live_server.url, f"/episodes/{episode.id}/", "reader")
    call = page.locator('[data-field="tool_calls"] .call')
    shown = call.locator("pre")
    pretty = '{\n  "actions": [\n    "move_left",\n    "do"\n  ]\n}'
    expect(shown).to_have_text(pretty)
    assert shown.text_content() == pretty
    expect(call.locator(".call-head code")).to_have_text("interact_many")
    expect(call.locator(".chip.warn")).to_have_count(0)
    _fits(page, width)

    page.keyboard.press("ArrowRight")
    expect(call.locator(".chip.warn")).to_have_text("not JSON: the arguments as sent")
    expect(shown).to_have_text(malformed)
    assert shown.text_content() == malformed
    assert page.evaluate("window.pwned") is None  # shown as text, never run

    page.keyboard.press("ArrowRight")
    whole = json.dumps(json.loads(long), indent=2)
    expect(shown).to_contain_text('"pad": "xxx')
    assert shown.text_content() == whole[:2000] + "…"
    page.click("text=Show all")
    expect(shown).to_have_text(whole)
    assert shown.text_content() == whole
    _fits(page, width)
    page.keyboard.press("ArrowLeft")
    expect(call.locator(".chip.warn")).to_have_count(1)
    shots = ROOT / "var" / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    call.scroll_into_view_if_needed()
    page.screenshot(path=str(shots / f"episode-viewer-tool-calls-{width}.png"))


@pytest.mark.parametrize("width", WIDTHS)
def test_a_fork_from_the_viewer_opens_at_its_turn_once_recorded_without_a_reload(
    studio_page: Page, live_server, width: int
):
    from studio.testing import queue_purge

    page = studio_page
    page.set_viewport_size({"width": width, "height": 900})
    _user("forker", editor=True)
    episode = _played_episode(steps=20, seed=7)
    _log_in(page, live_server.url, f"/episodes/{episode.id}/", "forker")
    for _ in range(5):
        page.keyboard.press("ArrowRight")
    expect(page.locator("#turn-pos")).to_have_text(f"6 / {episode.turns.count()}")
    page.click("#fork-box summary")
    page.select_option("#fork-form select[name=policy]", "scripted")
    _fits(page, width)
    page.click("#fork-submit")
    expect(page).to_have_url(re.compile(r"/episodes/\d+/\?turn=5$"))
    fork = Episode.objects.get(forked_from=episode)
    at_fork = f"{live_server.url}/episodes/{fork.id}/?turn=5"
    assert page.url == at_fork
    # No worker yet: the page says what it waits for, and asks again on its own.
    waiting = page.locator("#episode-waiting")
    expect(waiting).to_contain_text(f"Replaying episode {episode.id} up to turn 5")
    expect(page.locator("#viewer")).to_have_count(0)
    with page.expect_response(lambda r: r.url == at_fork and r.request.headers.get("hx-request")):
        pass
    expect(waiting).to_be_visible()
    _fits(page, width)

    # The worker's part, played here: the page shows the fork at turn 5 without a reload.
    assert services.episode_run(episode_id=fork.id) == "finished"
    queue_purge()  # the fork's task, sent to a broker no worker of this test reads
    expect(page.locator("#turn-pos")).to_have_text(f"6 / {fork.turns.count()}")
    assert page.url == at_fork
    expect(page.locator("#forked-from")).to_have_text(f"episode {episode.id} at turn 5")
    _fits(page, width)


def test_a_turn_shows_its_advantage_only_when_a_run_gave_it_one(studio_page: Page, live_server):
    page = studio_page
    _user("rl-reviewer", editor=False)
    episode = _played_episode(steps=3, seed=4)
    Turn.objects.filter(episode=episode, index=1).update(advantage=-0.70710678)
    path = f"/episodes/{episode.id}/"
    _log_in(page, live_server.url, path, "rl-reviewer")
    chip = page.locator('#turn-panel [data-field="advantage"]')
    expect(page.locator('#turn-panel [data-field="model_text"]')).not_to_have_text("loading…")
    expect(chip).to_be_hidden()
    page.keyboard.press("ArrowRight")
    expect(chip).to_be_visible()
    expect(chip).to_have_text("advantage -0.707")
    page.keyboard.press("ArrowRight")
    expect(chip).to_be_hidden()
