"""What browser tests share besides their fixtures (`conftest.py`): where screenshots go, and
logging in as a reviewer."""

from __future__ import annotations

import os
from pathlib import Path

from django.contrib.auth.models import Permission, User
from playwright.sync_api import Page, expect

ROOT = Path(__file__).resolve().parents[2]


def screenshot_dir(*, docs: bool = True) -> Path:
    """docs/screenshots (the README's pictures) when UPDATE_SCREENSHOTS=1 and `docs`, else
    var/screenshots: the docs are rewritten only when asked, so that a test run leaves the
    checkout as it found it."""
    to_docs = docs and os.environ.get("UPDATE_SCREENSHOTS") == "1"
    folder = ROOT / ("docs" if to_docs else "var") / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def log_in_reviewer(page: Page, base_url: str, path: str, username: str) -> User:
    """A new user with the review permission, logged in through the login page, on `path`."""
    user = User.objects.create_user(username, password=f"{username}-pass-123")
    user.user_permissions.add(Permission.objects.get(codename="review_turn"))
    page.goto(base_url + path)
    page.fill("#id_username", username)
    page.fill("#id_password", f"{username}-pass-123")
    page.click("main button[type=submit]")
    expect(page).to_have_url(base_url + path)
    return user
