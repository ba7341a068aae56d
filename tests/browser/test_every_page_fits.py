"""Every page of the studio, with real data, on a 360 px phone and a 2,560 px screen.

The page itself never scrolls sideways (wide tables scroll inside their own box) and the
page's main heading is on screen. Screenshots go under var/screenshots/every-page/.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Browser, expect

from curation import services as dataset_services
from curation.export_options import ExportOptions
from curation.models import DatasetImport
from rollouts.models import Episode
from rollouts.review.turn_selection import TurnSelection
from rollouts.tests.helpers import record_batch

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHOTS = Path(__file__).resolve().parents[2] / "var" / "screenshots" / "every-page"


@pytest.mark.parametrize("width", [360, 2560])
def test_every_page_fits_the_screen(chromium: Browser, live_server, width: int):
    # Long names and many achievements: the content that widened pages before.
    scripted = record_batch(
        seeds=(0, 1, 2), steps=120, name="a scripted run with a rather long descriptive name"
    )
    rand = record_batch(policy="random", seeds=(1, 2), steps=40, name="random")
    episode = Episode.objects.filter(batch=scripted).order_by("seed").first()
    dataset = dataset_services.dataset_create(
        name="every page dataset",
        filters=TurnSelection(batches=(scripted.id,)),
        options=ExportOptions(),
    )
    # A finished import of a file with a long name; its row and page are on the import pages.
    failed_import = DatasetImport.objects.create(
        original_name="crafter_turns_" + "x" * 120 + ".jsonl",
        upload="imports/none.jsonl",
        status=DatasetImport.Status.FAILED,
        error="line 3: the row has no messages",
    )
    # A superuser: every link in the top bar (Admin too) and every form on the pages.
    User.objects.create_superuser("looker", password="looker-pass-123")

    pages = {
        "batch-list": "/rollouts/",
        "batch-new": "/rollouts/new/",
        "batch": f"/rollouts/{scripted.id}/",
        "turns": "/turns/",
        "bulk-flag": f"/turns/bulk-flag/?batch={scripted.id}&set_flagged=1",
        "episode": f"/episodes/{episode.id}/",
        "play-new": "/play/new/",
        "datasets": "/datasets/",
        "dataset": f"/datasets/{dataset.id}/",
        "dataset-new": "/datasets/new/",
        "import": "/datasets/import/",
        "import-detail": f"/datasets/imports/{failed_import.id}/",
        "training": "/training/",
        "training-new": "/training/new/",
        "compare": f"/compare/?batches={scripted.id},{rand.id}",
        "compare-seed": f"/compare/seed/1/?batches={scripted.id},{rand.id}",
        "leaderboard": "/leaderboard/",
    }
    context = chromium.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    page.goto(live_server.url + "/login/")
    page.fill("#id_username", "looker")
    page.fill("#id_password", "looker-pass-123")
    page.click("main button[type=submit]")
    expect(page.locator("h1")).to_be_visible()

    SHOTS.mkdir(parents=True, exist_ok=True)
    too_wide = {}
    for name, path in pages.items():
        response = page.goto(live_server.url + path)
        assert response is not None and response.status == 200, (name, path)
        expect(page.locator("main h1").first).to_be_visible()
        page.screenshot(path=str(SHOTS / f"{name}-{width}.png"), full_page=True)
        scroll_width = page.evaluate("document.documentElement.scrollWidth")
        if scroll_width > page.evaluate("window.innerWidth"):
            too_wide[name] = scroll_width
    context.close()
    assert too_wide == {}, f"pages wider than {width} px: {too_wide}"
