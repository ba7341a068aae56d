"""The episode viewer in headless Debian Chromium on frames that live in an S3 bucket (moto's
server): every image the page loads comes from the studio, to a logged-in user, with the
bucket's bytes; the page never names the bucket."""

from __future__ import annotations

import hashlib

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from rollouts.models import Turn
from rollouts.recording import services
from rollouts.rollout_settings import RolloutSettings
from tests.browser.conftest import (  # noqa: F401 (fixtures)
    allow_orm_beside_event_loop,
    chromium,
    studio_page,
)
from tests.s3_server import Bucket, s3_bucket, s3_server  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_viewer_shows_frames_from_the_bucket_through_the_studio_only(
    studio_page: Page,  # noqa: F811
    live_server,
    s3_bucket: Bucket,  # noqa: F811
):
    page = studio_page
    User.objects.create_user("looker", password="looker-pass-123")
    batch = services.batch_run_inline(
        settings=RolloutSettings(policy="scripted", seeds=(7,), steps=6, name="on s3")
    )
    episode = batch.episodes.get()
    turns = list(Turn.objects.filter(episode=episode).select_related("frame").order_by("index"))
    images: dict[str, bytes] = {}
    page.on(
        "response",
        lambda r: images.__setitem__(r.url, r.body()) if r.request.resource_type == "image" else 0,
    )

    path = f"/episodes/{episode.id}/"
    page.goto(live_server.url + path)
    expect(page).to_have_url(f"{live_server.url}/login/?next={path}")
    page.fill("#id_username", "looker")
    page.fill("#id_password", "looker-pass-123")
    page.click("main button[type=submit]")
    expect(page).to_have_url(f"{live_server.url}{path}?turn=0")
    frame = page.locator("#frame-main")
    page.wait_for_function("document.querySelector('#frame-main').naturalWidth > 0")
    page.keyboard.press("ArrowRight")
    expect(page.locator("#turn-pos")).to_have_text(f"2 / {len(turns)}")
    page.wait_for_function(
        "(sha) => document.querySelector('#frame-main').src.includes(sha)"
        " && document.querySelector('#frame-main').complete"
        " && document.querySelector('#frame-main').naturalWidth > 0",
        arg=turns[1].frame.sha256,
    )
    page.wait_for_load_state("networkidle")

    html = page.content()
    assert s3_bucket.server.url not in html and s3_bucket.name not in html
    assert frame.get_attribute("src").startswith("/frames/")
    frames = {url: body for url, body in images.items() if "/frames/" in url}
    assert frames, images.keys()
    assert all(url.startswith(live_server.url + "/frames/") for url in images), images.keys()
    for turn in turns[:2]:
        sha = turn.frame.sha256
        key = f"frames/{sha[:2]}/{sha[2:4]}/{sha}.png"
        body = frames[f"{live_server.url}/frames/{sha}.png"]
        assert body == s3_bucket.read(key)
        assert hashlib.sha256(body).hexdigest() == sha
