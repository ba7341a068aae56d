"""The browser fixtures (headless Debian Chromium, a page) for every browser test here."""

from tests.browser.test_episode_viewer import (  # noqa: F401
    allow_orm_beside_event_loop,
    chromium,
    studio_page,
)
