"""Login tries sent at once cost one try each.

40 tries at one username at once (39 wrong, 1 right), each from its own loopback address:
all 40 were processed and none got 429, because the failures were counted after the
passwords were checked and read before. And a right password cleared every failure of the
user, the ones raced with it included.
"""

from __future__ import annotations

import http.client
import threading
from urllib.parse import urlencode, urlsplit

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from studio.models import LoginFailure

TRIES = 24
LIMIT = 5  # STUDIO_LOGIN_MAX_FAILURES
CSRF_SECRET = "c" * 32
RIGHT = "victim-pass-123"


def _login_over_http(url: str, *, address: str, password: str, start: threading.Barrier) -> int:
    """POST the login form from `address` once every thread is ready; the status code."""
    server = urlsplit(url)
    body = urlencode(
        {"username": "victim", "password": password, "csrfmiddlewaretoken": CSRF_SECRET}
    )
    connection = http.client.HTTPConnection(
        server.hostname, server.port, timeout=180, source_address=(address, 0)
    )
    try:
        connection.connect()
        start.wait(timeout=180)
        connection.request(
            "POST",
            reverse("login"),
            body=body,
            headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "Cookie": f"csrftoken={CSRF_SECRET}",
            },
        )
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


@pytest.mark.django_db(transaction=True)
def test_tries_sent_at_once_cost_one_try_each(live_server, settings):
    settings.STUDIO_LOGIN_MAX_FAILURES = LIMIT
    settings.STUDIO_LOGIN_MAX_FAILURES_PER_ADDRESS = 20
    User.objects.create_user("victim", password=RIGHT)
    passwords = [f"guess-{n}" for n in range(TRIES - 1)] + [RIGHT]
    start = threading.Barrier(TRIES)
    statuses: dict[str, int | str] = {}

    def attempt(number: int) -> None:
        password = passwords[number]
        try:
            statuses[password] = _login_over_http(
                live_server.url, address=f"127.0.0.{number + 2}", password=password, start=start
            )
        except Exception as exc:  # shown in the assertion below, not lost in a thread
            statuses[password] = repr(exc)

    threads = [threading.Thread(target=attempt, args=(n,)) for n in range(TRIES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    # The form again, logged in, or turned away.
    assert set(statuses.values()) <= {200, 302, 429}, statuses
    assert len(statuses) == TRIES
    wrong_checked = [p for p, status in statuses.items() if p != RIGHT and status == 200]
    right_checked = statuses[RIGHT] == 302
    # At most LIMIT wrong passwords were checked, the rest turned away. The right one,
    # once in, takes its own row back (it was no failure): one more wrong one may then
    # get through, never more.
    assert len(wrong_checked) <= LIMIT
    assert list(statuses.values()).count(429) == TRIES - len(wrong_checked) - right_checked
    # Each wrong password checked is a failure, whether or not the right one got in.
    assert LoginFailure.objects.filter(username="victim").count() == len(wrong_checked)


@pytest.mark.django_db
def test_a_login_clears_the_failures_from_its_own_address_only(settings):
    settings.STUDIO_LOGIN_MAX_FAILURES = 5
    User.objects.create_user("victim", password=RIGHT)
    login = reverse("login")
    attacker = Client(REMOTE_ADDR="203.0.113.7")
    for _ in range(3):
        assert attacker.post(login, {"username": "victim", "password": "guess"}).status_code == 200
    owner = Client(REMOTE_ADDR="198.51.100.1")
    assert owner.post(login, {"username": "victim", "password": "typo"}).status_code == 200
    assert owner.post(login, {"username": "victim", "password": RIGHT}).status_code == 302
    # The owner's typo is gone; the attacker's three are not, and two more lock the user.
    assert LoginFailure.objects.filter(username="victim").count() == 3
    for _ in range(2):
        assert attacker.post(login, {"username": "victim", "password": "guess"}).status_code == 200
    response = Client(REMOTE_ADDR="198.51.100.2").post(
        login, {"username": "victim", "password": RIGHT}
    )
    assert response.status_code == 429


@pytest.mark.django_db
def test_a_post_whose_password_was_never_checked_costs_nothing(settings):
    settings.STUDIO_LOGIN_MAX_FAILURES = 1
    User.objects.create_user("victim", password=RIGHT)
    client = Client(REMOTE_ADDR="203.0.113.7")
    for _ in range(3):
        # No password: the form refuses it before it asks for one to be checked.
        assert client.post(reverse("login"), {"username": "victim"}).status_code == 200
    assert not LoginFailure.objects.exists()
    assert (
        client.post(reverse("login"), {"username": "victim", "password": RIGHT}).status_code == 302
    )
