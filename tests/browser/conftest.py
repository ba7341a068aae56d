"""The browser tests' fixtures: headless Debian Chromium, a page of it, and what a page test
needs beside them (a beat sending the training poll, the training tests' providers).

Playwright's sync API runs an event loop in the test's thread, so Django's ORM calls made
there need DJANGO_ALLOW_ASYNC_UNSAFE (set for these tests only). Never downloads a browser.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connections
from playwright.sync_api import Browser, Page, sync_playwright

from training.tests.conftest import fast_training, synth_server, train_version  # noqa: F401

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
# A test module may set its own `VIEWPORT` for `studio_page`.
VIEWPORT = {"width": 1400, "height": 900}


@pytest.fixture
def allow_orm_beside_event_loop(monkeypatch) -> None:
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture
def chromium(allow_orm_beside_event_loop) -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (make test does)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        # While Playwright's loop runs, Django keeps this thread's ORM connection apart
        # (context-local storage); close it here, or it outlives the test database.
        connections.close_all()
        browser.close()


@pytest.fixture
def studio_page(chromium: Browser, request) -> Iterator[Page]:
    context = chromium.new_context(viewport=getattr(request.module, "VIEWPORT", VIEWPORT))
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def beat() -> Iterator[threading.Event]:
    """What `celery beat` does for training, every 0.3 s: send the poll task."""
    from training.tasks import training_jobs_poll

    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(0.3):
            training_jobs_poll.delay()

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    yield stop
    stop.set()
    thread.join()
