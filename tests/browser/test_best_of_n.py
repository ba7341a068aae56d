"""Best-of-N on the dataset page, in headless Chromium: the live counts list what each seed
group keeps as the filter changes, and the page fits a 360 px phone and a 2,560 px screen."""

from __future__ import annotations

import pytest
from playwright.sync_api import Browser, expect

from curation import services as dataset_services
from curation.export_options import ExportOptions
from rollouts.models import Episode
from rollouts.recording import services
from rollouts.review.turn_selection import TurnSelection
from rollouts.rollout_settings import RolloutSettings
from tests.browser.test_episode_viewer import ROOT, _log_in_at, _user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Elements that stick out of the screen (tables inside their scroll boxes may), for the message.
WIDER_THAN_THE_SCREEN = """
[...document.querySelectorAll("body *")]
  .filter(e => e.getBoundingClientRect().right > innerWidth + 1
               && !e.closest(".seed-groups table, .table-scroll table"))
  .slice(0, 8)
  .map(e => `${e.tagName}.${e.className}#${e.id} ${Math.round(e.getBoundingClientRect().right)}`)
"""


@pytest.mark.parametrize("width", [360, 2560])
def test_the_live_counts_show_each_groups_kept_samples(
    chromium: Browser,
    live_server,
    width,
):
    batch = services.batch_run_inline(
        settings=RolloutSettings(policy="random", seeds=(3, 4), samples_per_seed=3, steps=5)
    )
    assert batch.episodes_finished == 6, batch.error
    # seed 3: sample 2 is best by hand; seed 4 keeps its recorded outcomes
    Episode.objects.filter(batch=batch, seed=3).update(achievement_count=0, total_reward=0.0)
    Episode.objects.filter(batch=batch, seed=3, sample=2).update(achievement_count=4)
    dataset = dataset_services.dataset_create(
        name="best", filters=TurnSelection(batches=(batch.id,)), options=ExportOptions()
    )
    _user("curator", editor=True)
    context = chromium.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    try:
        path = f"/datasets/{dataset.id}/"
        _log_in_at(page, live_server.url, path, "curator")
        expect(page.locator('#counts [data-count="episodes"]')).to_have_text("6")
        page.fill("#id_top_per_seed", "1")
        page.locator("#id_top_per_seed").blur()
        expect(page.locator('#counts [data-count="episodes"]')).to_have_text("2")
        seed3 = page.locator('#counts tr[data-seed="3"]')
        expect(seed3.locator("a.kept")).to_have_count(1)
        expect(seed3.locator("a.kept")).to_contain_text("s2 4/")
        expect(seed3.locator("a.dropped")).to_have_count(2)
        overflow = page.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        wide = page.evaluate(WIDER_THAN_THE_SCREEN)
        shot = ROOT / "var" / "screenshots" / f"dataset-best-of-n-{width}.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.locator("#counts").screenshot(path=str(shot))
        assert overflow <= 1, f"the page is {overflow} px wider than a {width} px screen: {wide}"
    finally:
        context.close()
