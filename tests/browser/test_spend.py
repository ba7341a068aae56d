"""Spend in the browser: the batch list and a batch's page show it on a
360 px phone and a 2,560 px screen, and the batch form's estimate follows what is typed."""

from __future__ import annotations

from decimal import Decimal

import pytest
from playwright.sync_api import Browser, expect

from rollouts.models import Episode, RolloutBatch
from rollouts.recording import services
from rollouts.rollout_settings import RolloutSettings
from studio.models import Endpoint
from tests.browser.support import log_in_reviewer, screenshot_dir

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _played_model_batch() -> RolloutBatch:
    endpoint = Endpoint.objects.create(
        name="priced",
        base_url="http://127.0.0.1:9/v1",
        input_price_per_million=Decimal("2.50"),
        output_price_per_million=Decimal("10"),
    )
    batch = services.batch_create(
        settings=RolloutSettings(
            policy="openai",
            model="vlm-x",
            endpoint=endpoint.name,
            base_url=endpoint.base_url,
            seeds=(0, 1, 2),
            steps=10,
            name="a model batch with a rather long descriptive name, canceled",
        ),
        enqueue=False,
    )
    for seed, status, prompt, completion in (
        (0, "finished", 120_000, 6_000),
        (1, "failed", 50_000, 2_500),
        (2, "canceled", 30_000, 1_500),
    ):
        Episode.objects.filter(batch=batch, seed=seed).update(
            status=status, model_calls=5, prompt_tokens=prompt, completion_tokens=completion
        )
    # 10 calls of 1,500.5 prompt and 80 completion tokens each, for the form's estimate.
    RolloutBatch.objects.filter(id=batch.id).update(
        status="canceled",
        episodes_finished=1,
        episodes_failed=2,
        model_calls=10,
        prompt_tokens=15_005,
        completion_tokens=800,
    )
    return batch


@pytest.mark.parametrize("width", [360, 2560])
def test_the_batch_pages_show_spend_and_fit_the_screen(chromium: Browser, live_server, width):
    batch = _played_model_batch()
    context = chromium.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    log_in_reviewer(page, live_server.url, "/rollouts/", "spender")
    shots = screenshot_dir(docs=False)
    # 15,005 x 2.50 + 800 x 10 = 45,512.5 millionths: $0.0455..., to the cent $0.05.
    expect(page.locator("td[data-spend]").first).to_have_text("$0.05")
    expect(page.locator("td[data-canceled]").first).to_have_text("1")
    page.screenshot(path=str(shots / f"spend-batch-list-{width}.png"), full_page=True)
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")

    page.goto(f"{live_server.url}/rollouts/{batch.id}/")
    expect(page.locator("[data-canceled]").first).to_have_text("1 canceled")
    expect(page.locator("[data-failed]").first).to_have_text("1 failed")
    # Per episode: 120,000 x 2.5 + 6,000 x 10 = 360,000 millionths, $0.36.
    expect(page.locator("td[data-spend]").first).to_have_text("$0.36")
    page.screenshot(path=str(shots / f"spend-batch-{width}.png"), full_page=True)
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    context.close()


def test_the_batch_form_estimates_as_it_changes(studio_page, live_server):
    _played_model_batch()
    page = studio_page
    log_in_reviewer(page, live_server.url, "/rollouts/new/", "estimator")
    estimate = page.locator("#batch-estimate")
    expect(estimate).to_contain_text("calls no model")  # the scripted policy, first
    page.select_option("select[name=policy]", "openai")
    page.fill("input[name=model]", "vlm-x")
    page.select_option("select[name=endpoint]", "priced")
    page.fill("input[name=seeds]", "0-9")
    page.fill("input[name=steps]", "64")
    # 640 calls x (1,500.5 x 2.50 + 80 x 10) millionths = $2.9128.
    expect(estimate).to_contain_text("about $2.91 for up to 640 model calls")
    page.fill("input[name=seeds]", "0-19")
    expect(estimate).to_contain_text("about $5.83 for up to 1,280 model calls")
    page.fill("input[name=model]", "never-played")
    expect(estimate).to_contain_text("A guess: no earlier batch of never-played made a call")
    page.screenshot(path=str(screenshot_dir(docs=False) / "spend-estimate.png"), full_page=True)
