"""The login limit counts a username as the login form reads it.

The form strips and NFKC-normalises the username before it authenticates, so `" victim"`
and `victim` in full-width letters are `victim` to it. A limit keyed on the raw text would
give each spelling fresh attempts, and `" victim"` with the right password would get in
while `victim` was locked.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from studio.login_throttle import login_username_key
from studio.models import LoginFailure

FULL_WIDTH = "\uff56\uff49\uff43\uff54\uff49\uff4d"  # victim, full-width
VARIANTS = [" victim", "victim ", "\tvictim", FULL_WIDTH, "VICTIM", "\u3000Victim\n"]


def _login(client: Client, username: str, password: str, *, admin: bool):
    url = reverse("admin:login") if admin else reverse("login")
    return client.post(url, {"username": username, "password": password})


@pytest.fixture
def victim(db) -> User:
    return User.objects.create_superuser("victim", password="victim-pass-123")


@pytest.mark.django_db
@pytest.mark.parametrize("admin", [False, True], ids=["login", "admin-login"])
def test_it_throttles_every_spelling_of_a_locked_username(victim, settings, admin):
    settings.STUDIO_LOGIN_MAX_FAILURES = 5
    for _ in range(5):
        assert (
            _login(Client(REMOTE_ADDR="203.0.113.7"), "victim", "guess", admin=admin).status_code
            == 200
        )
    for variant in VARIANTS:
        response = _login(Client(REMOTE_ADDR="198.51.100.1"), variant, "guess", admin=admin)
        assert response.status_code == 429, repr(variant)
        assert "Too many failed logins" in response.content.decode()
    # The right password, spelled as the form would accept it, waits too.
    client = Client(REMOTE_ADDR="198.51.100.2")
    for variant in (" victim", FULL_WIDTH, "victim"):
        assert _login(client, variant, "victim-pass-123", admin=admin).status_code == 429
    assert "_auth_user_id" not in client.session
    # The throttled attempts were refused before the form, so they added no rows.
    assert LoginFailure.objects.filter(username="victim").count() == 5


@pytest.mark.django_db
def test_it_counts_failures_under_each_spelling_as_one_user(victim, settings):
    settings.STUDIO_LOGIN_MAX_FAILURES = 5
    for variant in VARIANTS[:5]:
        assert _login(Client(), variant, "guess", admin=False).status_code == 200
    assert set(LoginFailure.objects.values_list("username", flat=True)) == {"victim"}
    assert _login(Client(), "victim", "victim-pass-123", admin=False).status_code == 429


@pytest.mark.django_db
def test_it_clears_failures_of_any_spelling_when_the_user_logs_in(victim, settings):
    settings.STUDIO_LOGIN_MAX_FAILURES = 3
    for variant in (" victim", FULL_WIDTH):
        _login(Client(), variant, "typo", admin=False)
    assert _login(Client(), "victim ", "victim-pass-123", admin=False).status_code == 302
    assert not LoginFailure.objects.exists()


def test_it_keys_a_username_as_the_form_reads_it_and_cuts_it_to_the_column():
    assert login_username_key(" " + FULL_WIDTH + "\t") == "victim"
    assert login_username_key("Victim") == "victim"
    assert len(login_username_key("x" * 400)) == 150
