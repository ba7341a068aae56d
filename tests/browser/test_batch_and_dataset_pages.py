"""The batch form, the batch page's actions and the dataset filters in headless Chromium.

Playwright's sync API runs an event loop in this thread, so Django's ORM calls made here
need DJANGO_ALLOW_ASYNC_UNSAFE (set for these tests only). Never downloads a browser.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from curation.models import Dataset
from rollouts.models import Episode, RolloutBatch
from rollouts.recording import services
from rollouts.rollout_settings import RolloutSettings
from tests.browser.support import log_in_reviewer

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

VIEWPORT = {"width": 1280, "height": 900}  # for `studio_page`


def _log_in(page: Page, base_url: str, path: str) -> User:
    return log_in_reviewer(page, base_url, path, "curator")


def _field(page: Page, name: str):
    return page.locator(f'.field[data-field="{name}"]')


def test_it_shows_the_fields_of_the_chosen_policy_and_every_error(studio_page: Page, live_server):
    page = studio_page
    _log_in(page, live_server.url, "/rollouts/new/")
    expect(_field(page, "actions")).to_be_visible()
    for name in ("model", "temperature", "observation_mode", "requests_per_minute"):
        expect(_field(page, name)).to_be_hidden()

    page.select_option("select[name=policy]", "openai")
    expect(_field(page, "actions")).to_be_hidden()
    for name in (
        "model",
        "temperature",
        "observation_mode",
        "image_detail",
        "max_tokens",
        "on_bad_output",
        "max_retries",
        "request_timeout",
        "requests_per_minute",
    ):
        expect(_field(page, name)).to_be_visible()
    page.fill("input[name=temperature]", "5")
    page.fill("input[name=seeds]", "3-1")
    page.click("main button[type=submit]")
    # All three problems at once, in the page's words.
    expect(_field(page, "model").locator(".error")).to_have_text(
        "The openai policy needs a model name."
    )
    expect(_field(page, "temperature").locator(".error")).to_contain_text("between 0 and 2")
    expect(_field(page, "seeds").locator(".error")).to_contain_text("ends before it starts")
    assert "--" not in page.locator("main").inner_text()
    expect(_field(page, "model")).to_be_visible()  # the policy stayed openai

    page.select_option("select[name=policy]", "scripted")
    page.fill("input[name=seeds]", "0-1")
    page.fill("input[name=steps]", "5")
    page.fill("input[name=actions]", "do noop")
    page.click("main button[type=submit]")
    expect(page.locator(".messages")).to_contain_text("2 episodes queued")
    batch = RolloutBatch.objects.get()
    assert (batch.policy, batch.seeds, batch.settings["actions"]) == (
        "scripted",
        [0, 1],
        ["do", "noop"],
    )


def test_it_cancels_resumes_and_runs_a_batch_again(studio_page: Page, live_server):
    page = studio_page
    batch = services.batch_create(
        settings=RolloutSettings(policy="scripted", seeds=(0, 1, 2), steps=7, name="to stop"),
        enqueue=False,
    )
    episode = batch.episodes.get(seed=0)
    assert services.episode_run(episode_id=episode.id) == "finished"
    services.episode_claim(episode_id=batch.episodes.get(seed=1).id)  # a worker is on it
    path = f"/rollouts/{batch.id}/"
    _log_in(page, live_server.url, path)
    # Running, nothing failed: nothing to resume yet.
    expect(page.locator('[data-action="resume"]')).to_have_count(0)

    page.once("dialog", lambda dialog: dialog.accept())
    page.click('[data-action="cancel"]')
    expect(page.locator(".messages")).to_contain_text("Canceled: 2 episodes stopped.")
    expect(page.locator("h1 .badge")).to_have_text("canceled")
    expect(page.locator('[data-action="cancel"]')).to_have_count(0)
    # Canceled, not failed: counted apart.
    expect(page.locator("[data-failed]")).to_have_text("0 failed")
    expect(page.locator("[data-canceled]")).to_have_text("2 canceled")
    expect(page.locator('[data-action="resume"]')).to_have_text("Resume (2)")
    assert set(batch.episodes.exclude(id=episode.id).values_list("error", flat=True)) == {
        "canceled"
    }

    page.click('[data-action="resume"]')
    expect(page.locator(".messages")).to_contain_text("Resumed: 2 unfinished episodes queued.")
    assert set(batch.episodes.exclude(id=episode.id).values_list("status", flat=True)) == {
        Episode.Status.PENDING
    }

    page.click('[data-action="run-again"]')
    expect(page.locator("input[name=seeds]")).to_have_value("0-2")
    expect(page.locator("input[name=steps]")).to_have_value("7")
    expect(page.locator("input[name=name]")).to_have_value("to stop")
    page.fill("input[name=name]", "again")
    page.click("main button[type=submit]")
    expect(page.locator("h1")).to_contain_text("again")
    again = RolloutBatch.objects.get(name="again")
    assert (again.seeds, again.step_limit, again.settings["actions"]) == (
        [0, 1, 2],
        7,
        batch.settings["actions"],
    )


def test_it_filters_a_dataset_with_searchable_checkbox_lists(studio_page: Page, live_server):
    page = studio_page
    batch = services.batch_run_inline(
        settings=RolloutSettings(policy="scripted", seeds=(1, 2), steps=4, name="small")
    )
    count_urls: list[str] = []
    page.on("request", lambda r: count_urls.append(r.url) if "/datasets/counts/" in r.url else 0)
    _log_in(page, live_server.url, "/datasets/new/")

    required = _field(page, "require_achievements")
    expect(required.locator(".checklist-option")).to_have_count(22)
    required.locator("[data-checklist-search]").fill("wood")
    visible = required.locator(".checklist-option:visible")
    expect(visible).to_have_count(3)  # collect_wood, make_wood_pickaxe, make_wood_sword
    expect(_field(page, "include_assistant")).to_contain_text("studio turns never have one")
    expect(page.locator("select[name=format] option[value=openai]")).to_have_text("OpenAI")

    batches = _field(page, "batches")
    with page.expect_response(lambda r: "/datasets/counts/" in r.url):
        batches.locator("label", has_text="small").locator("input").check()
    counts = page.locator("#counts")
    expect(counts.locator('[data-count="turns"]')).to_have_text("8")
    expect(counts.locator('[data-count="episodes"]')).to_have_text("2")
    expect(counts.locator('[data-count="split"]')).to_contain_text("train 8")
    expect(counts.locator('[data-count="tokens"]')).not_to_be_empty()

    with page.expect_response(lambda r: "/datasets/counts/" in r.url):
        page.select_option("select[name=format]", "openai")
    expect(counts).to_contain_text("at least 10 rows")
    expect(counts.locator('[data-count="turns"]')).to_have_text("8")

    with page.expect_response(lambda r: "/datasets/counts/" in r.url):
        page.select_option("select[name=format]", "studio")
    page.fill("input[name=name]", "two episodes")
    page.click("main button[type=submit]")
    expect(page.locator("h1")).to_have_text("two episodes")
    assert Dataset.objects.get().filters["batches"] == [batch.id]
    assert count_urls and not any("csrfmiddlewaretoken" in url for url in count_urls)
