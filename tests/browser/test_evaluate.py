"""Evaluate on a succeeded training job, in headless Chromium, to the comparison page.

A real worker plays the fine-tuned model, then the base model, against the local chat
server; the job page then links to /compare/ with the base model first.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from evaluation.tests.test_baselines import end, evaluation_batch
from rollouts.models import RolloutBatch
from rollouts.tests.helpers import BATCH_ENDS
from studio.testing import wait_for_row
from tests.browser.test_episode_viewer import _log_in_at, _user
from training.tests.test_evaluate import BASE, FINE_TUNED, _job

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
SCREENSHOT = Path(__file__).resolve().parents[2] / "var" / "screenshots" / "training-evaluate.png"


def test_it_evaluates_a_job_and_its_base_model_then_opens_the_comparison(
    studio_page: Page, live_server, celery_worker, chat_server, chat_endpoint, editor
):
    page = studio_page
    job = _job(seeds=(0, 2))
    page.goto(f"{live_server.url}/training/{job.id}/")
    page.fill("#id_username", "editor")
    page.fill("#id_password", "editor-pass-123")
    page.click("main button[type=submit]")
    expect(page).to_have_url(f"{live_server.url}/training/{job.id}/")

    page.click("#evaluate-job")
    page.fill("#id_count", "2")
    expect(page.locator("#held-out-seeds")).to_have_text("1,3-21")  # the page's default, 20
    page.fill("#id_steps", "3")
    page.select_option("#id_endpoint", chat_endpoint.name)
    page.click("#evaluate-submit")
    tuned = wait_for_row(
        RolloutBatch.objects.get(model=FINE_TUNED), statuses=BATCH_ENDS, timeout=120
    )
    assert (tuned.seeds, tuned.status) == ([1, 3], "finished")

    page.reload()
    row = page.locator(f"tr[data-batch='{tuned.id}']")
    expect(row).to_contain_text("finished")
    page.click("button[data-action=evaluate-base]")
    base = wait_for_row(RolloutBatch.objects.get(model=BASE), statuses=BATCH_ENDS, timeout=120)
    assert (base.seeds, base.status) == ([1, 3], "finished")

    page.reload()
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    page.set_viewport_size({"width": 360, "height": 800})
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 380, f"the job page overflows a 360 px screen ({width} px)"
    page.click(f"tr[data-batch='{tuned.id}'] a.compare-link")
    expect(page).to_have_url(f"{live_server.url}/compare/?batches={base.id},{tuned.id}")
    expect(page.locator("#summary-table")).to_contain_text(f"#{tuned.id}")


@pytest.mark.parametrize("width", [390, 1400])
def test_a_base_batch_still_playing_shows_progress_then_the_comparison(
    studio_page: Page, live_server, width: int
):
    job = _job(seeds=(0, 2))
    tuned = evaluation_batch(job=job, model=FINE_TUNED, ended=6)
    base = evaluation_batch(job=job, model=BASE, ended=2)
    _user("watcher", editor=False)
    page = studio_page
    page.set_viewport_size({"width": width, "height": 900})
    _log_in_at(page, live_server.url, f"/training/{job.id}/", "watcher")

    row = page.locator(f"tr[data-batch='{tuned.id}']")
    expect(row.locator(".compare-waits")).to_contain_text(
        f"Base batch #{base.id} is playing: 2 of 6 episodes ended."
    )
    expect(row.locator("[role=progressbar]")).to_have_attribute("aria-valuenow", "2")
    expect(page.locator("a.compare-link")).to_have_count(0)
    expect(page.locator(f"tr[data-batch='{base.id}']")).to_contain_text("so far")
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    page.screenshot(
        path=str(SCREENSHOT.with_name(f"training-evaluate-waiting-{width}.png")), full_page=True
    )

    # The base batch ends: the table refreshes itself, and the comparison is there.
    end(base)
    expect(row.locator("a.compare-link")).to_have_text(f"Compare with base batch #{base.id}")
    expect(page.locator(".compare-waits")).to_have_count(0)
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    page.goto(f"{live_server.url}/rollouts/{tuned.id}/")
    expect(page.locator("#evaluates a.compare-link")).to_have_attribute(
        "href", f"/compare/?batches={base.id},{tuned.id}"
    )
