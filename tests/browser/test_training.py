"""Submitting a training job from /training/new/ in headless Chromium, to `succeeded`.

A real worker (in a thread, real Redis) runs the submission against a local synth server;
the beat task is sent every few hundred ms, as `celery beat` would, and the job page
refreshes itself until the job has produced its model.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from playwright.sync_api import Page, expect

from studio.models import Endpoint
from tests.browser.support import screenshot_dir
from training.models import TrainingJob
from training.tests.conftest import REFERENCE, SYNTH_KEY

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
SCREENSHOT = screenshot_dir() / "training-job.png"


def test_it_submits_from_the_page_and_follows_the_job_to_its_model(
    studio_page: Page, live_server, celery_worker, synth_server, train_version, beat
):
    page = studio_page
    Endpoint.objects.create(
        name="synth-local",
        kind="synth",
        base_url=synth_server.base_url,
        api_key_env="SYNTH_API_KEY",
    )
    user = User.objects.create_user("trainer", password="trainer-pass-123")
    user.user_permissions.add(Permission.objects.get(codename="submit_job"))

    page.goto(live_server.url + "/training/new/")
    page.fill("#id_username", "trainer")
    page.fill("#id_password", "trainer-pass-123")
    page.click("main button[type=submit]")
    expect(page).to_have_url(live_server.url + "/training/new/")
    editor = page.locator("#id_config")
    expect(editor).to_have_value(REFERENCE.read_text())
    page.select_option("#id_dataset_version", str(train_version.id))

    # A typo is shown beside its line as soon as it is typed.
    page.fill("#id_config", REFERENCE.read_text().replace("learning_rate =", "learning_rte ="))
    expect(page.locator("#toml-gutter .bad")).to_have_text("34")
    expect(page.locator(".config-errors")).to_contain_text(
        "learning_rte (line 34): unknown key; did you mean learning_rate?"
    )
    page.click(".goto-line")
    page.fill("#id_config", REFERENCE.read_text())
    expect(page.locator("#config-check")).to_contain_text("Config OK")
    expect(page.locator("#toml-gutter .bad")).to_have_count(0)

    page.click("button[value=preview]")
    expect(page.locator("#config-check")).to_contain_text(
        f"POST {synth_server.base_url}/learning/jobs"
    )
    assert synth_server.requests == []

    page.click("button[value=submit]")
    job = TrainingJob.objects.get()
    expect(page).to_have_url(f"{live_server.url}/training/{job.id}/")
    expect(page.locator("#job-status")).to_have_text("succeeded", timeout=60_000)
    expect(page.locator("#fine-tuned-model")).to_have_text("ft:gpt-4o-mini:studio:crafter:abc123")
    expect(page.locator("#timeline")).to_contain_text("Training finished")
    expect(page.locator("svg.loss-chart polyline.train")).to_have_count(1)
    expect(page.locator("svg.loss-chart polyline.val")).to_have_count(1)
    page.click("button[data-copy]")
    expect(page.locator("button[data-copy]")).to_have_text("Copied")
    assert SYNTH_KEY not in page.content()
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    assert {r["authorization"] for r in synth_server.requests} == {f"Bearer {SYNTH_KEY}"}
    assert len(synth_server.jobs) == 1

    page.goto(live_server.url + "/training/")
    expect(page.locator(f"tr[data-job='{job.id}']")).to_contain_text("succeeded")
    page.set_viewport_size({"width": 360, "height": 800})
    page.goto(f"{live_server.url}/training/{job.id}/")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 380, f"the job page overflows a 360 px screen ({width} px)"
    page.goto(live_server.url + "/training/new/")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 380, f"the new job page overflows a 360 px screen ({width} px)"


@pytest.mark.parametrize("width", [390, 1400])
def test_the_endpoints_follow_the_provider_and_errors_stay_on_their_lines(
    studio_page: Page, live_server, train_version, width
):
    from training.tests.conftest import version_of

    page = studio_page
    page.set_viewport_size({"width": width, "height": 900})
    Endpoint.objects.create(
        name="fake-synth", kind="synth", base_url="http://127.0.0.1:9/api", api_key_env="SYNTH_KEY"
    )
    Endpoint.objects.create(
        name="openai-local", kind="openai", base_url="http://127.0.0.1:9/v1", api_key_env="OA_KEY"
    )
    user = User.objects.create_user("trainer", password="trainer-pass-123")
    user.user_permissions.add(Permission.objects.get(codename="submit_job"))
    page.goto(live_server.url + "/training/new/")
    page.fill("#id_username", "trainer")
    page.fill("#id_password", "trainer-pass-123")
    page.click("main button[type=submit]")
    expect(page).to_have_url(live_server.url + "/training/new/")
    # The only finished version is chosen already; the endpoint is the provider's.
    expect(page.locator("#id_dataset_version")).to_have_value(str(train_version.id))
    expect(page.locator("#id_endpoint")).to_have_value("fake-synth")
    check = page.locator("#config-check")
    typo = REFERENCE.read_text().replace("learning_rate =", "learning_rte =")
    page.fill("#id_config", typo)
    expect(check.locator("li[data-line='34']")).to_contain_text("learning_rte (line 34)")

    page.select_option("#id_provider", "openai")
    expect(page.locator("#id_endpoint")).to_have_value("openai-local")
    expect(page.locator("#id_endpoint option[value=fake-synth]")).to_be_disabled()
    # The check that the provider's change sent still has the typo on its line, and no
    # complaint about the endpoint.
    expect(check).to_have_attribute("data-error-lines", "34")
    expect(check.locator("li[data-line='34']")).to_be_visible()
    expect(check).not_to_contain_text("endpoint")
    page.click("button[value=preview]")
    expect(page.locator("#id_provider")).to_have_value("openai")
    expect(check.locator("li[data-line='34']")).to_contain_text("learning_rte (line 34)")
    expect(page.locator("#toml-gutter .bad")).to_have_text("34")
    page.select_option("#id_provider", "synth")
    expect(page.locator("#id_endpoint")).to_have_value("fake-synth")
    width_now = page.evaluate("document.documentElement.scrollWidth")
    assert width_now <= width, f"the new job page scrolls sideways: {width_now} px"

    # An admin turns the endpoint off while the page is open: Preview's answer says so, and
    # the config's error is still on its line.
    Endpoint.objects.filter(name="fake-synth").update(enabled=False)
    page.click("button[value=preview]")
    expect(check).to_contain_text("Endpoint: Select a valid choice.")
    expect(check.locator("li[data-line='34']")).to_contain_text("learning_rte (line 34)")
    expect(page.locator("#toml-gutter .bad")).to_have_text("34")
    page.fill("#id_config", REFERENCE.read_text())
    expect(page.locator("#toml-gutter .bad")).to_have_count(0)
    expect(check.locator("li[data-line]")).to_have_count(0)

    # Two finished versions: the person chooses.
    version_of(seeds=(2,), steps=4, name="second")
    page.goto(live_server.url + "/training/new/")
    expect(page.locator("#id_dataset_version")).to_have_value("")
    assert TrainingJob.objects.count() == 0
