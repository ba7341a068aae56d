"""Cases found by trying the studio as an attacker would: each refused or made harmless."""

from __future__ import annotations

import os
import stat
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from rollouts.models import RolloutBatch
from studio.models import LoginFailure
from studio.secret_key import secret_key_from_file

# --- NUL bytes in addresses ---------------------------------------------------------------


@pytest.mark.django_db
def test_it_answers_400_to_a_nul_byte_in_the_address(client, admin_user):
    client.force_login(admin_user)
    # PostgreSQL refuses NUL in a query parameter: each of these must not reach a query.
    for url in (
        "/admin/rollouts/rolloutbatch/?status__exact=%00",
        "/admin/rollouts/rolloutbatch/?q=a%00b",
        "/turns/?model=%00",
        "/turns/?%00=1",
        "/rollouts/%00/",
    ):
        response = client.get(url)
        assert response.status_code == 400, url
        assert b"NUL bytes are not allowed" in response.content
    assert client.get("/admin/rollouts/rolloutbatch/?status__exact=failed").status_code == 200


# --- login throttling -----------------------------------------------------------------------


def _login(client: Client, username: str, password: str, *, admin: bool = False):
    url = reverse("admin:login") if admin else reverse("login")
    return client.post(url, {"username": username, "password": password})


@pytest.mark.django_db
def test_it_locks_a_username_after_five_failures_then_lets_it_in_later(editor, settings):
    settings.STUDIO_LOGIN_MAX_FAILURES = 5
    attacker = Client(REMOTE_ADDR="203.0.113.7")
    for _ in range(5):
        assert _login(attacker, "editor", "guess").status_code == 200  # the form again
    # Now even the right password waits, from any address and through either door.
    for door in (False, True):
        response = _login(
            Client(REMOTE_ADDR="198.51.100.1"), "editor", "editor-pass-123", admin=door
        )
        assert response.status_code == 429
        assert "Too many failed logins" in response.content.decode()
        assert 800 < int(response["Retry-After"]) <= 900
    # Someone else is not locked out by it.
    other = Client(REMOTE_ADDR="198.51.100.2")
    from django.contrib.auth.models import User

    User.objects.create_user("other", password="other-pass-123")
    assert _login(other, "other", "other-pass-123").status_code == 302
    # Once the failures are older than the window, the user gets in and the count restarts.
    LoginFailure.objects.update(at=timezone.now() - timedelta(seconds=901))
    assert _login(Client(), "editor", "editor-pass-123").status_code == 302
    assert not LoginFailure.objects.filter(username="editor").exists()


@pytest.mark.django_db
def test_it_locks_an_address_that_tries_many_usernames(viewer, settings):
    settings.STUDIO_LOGIN_MAX_FAILURES_PER_ADDRESS = 20
    sprayer = Client(REMOTE_ADDR="203.0.113.9")
    for number in range(20):
        assert (
            _login(sprayer, f"user{number}", "password1", admin=number % 2 == 0).status_code == 200
        )
    assert _login(sprayer, "viewer", "viewer-pass-123").status_code == 429
    assert (
        _login(Client(REMOTE_ADDR="203.0.113.10"), "viewer", "viewer-pass-123").status_code == 302
    )


@pytest.mark.django_db
def test_it_clears_a_users_failures_when_they_log_in(editor, settings):
    settings.STUDIO_LOGIN_MAX_FAILURES = 3
    client = Client()
    for _ in range(2):
        _login(client, "editor", "typo")
    assert _login(client, "editor", "editor-pass-123").status_code == 302
    client.logout()
    for _ in range(2):
        _login(client, "editor", "typo")
    assert _login(client, "editor", "editor-pass-123").status_code == 302


# --- the image sizes crafter can draw ---------------------------------------------------


@pytest.mark.django_db
def test_it_refuses_an_image_size_crafter_cannot_draw_in_the_form(editor_client):
    values = {"policy": "scripted", "seeds": "1", "steps": 5, "history_frames": 0}
    for size, ok in ((17, False), (9, False), (18, True)):
        response = editor_client.post(
            reverse("rollouts:batch_create"), {**values, "image_size": size}
        )
        if ok:
            assert response.status_code == 302
        else:
            assert "is not between 18 and 1024" in response.context["form"].errors["image_size"][0]
    assert RolloutBatch.objects.get().image_size == 18


# --- the development secret key -----------------------------------------------------------


def test_it_writes_the_development_secret_key_for_its_owner_only(tmp_path):
    previous = os.umask(0o022)  # the usual umask: files come out world-readable
    try:
        path = tmp_path / "var" / "secret_key"
        key = secret_key_from_file(path)
        assert len(key) >= 50
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert secret_key_from_file(path) == key  # the same key after a restart
        path.chmod(0o644)  # a file an older version wrote
        assert secret_key_from_file(path) == key
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    finally:
        os.umask(previous)
