"""A small rate limit on logins, per username and per address, for both login pages.

Attempts are rows (`LoginFailure`), so the limit holds across web processes with any
database, the demo's SQLite included, and needs no cache server. An attempt's row is
written before its password is checked and the count that admits it is taken after: of N
tries at once, at most the limit get through (of any limit + 1 admitted, the last to count
would have seen the other rows). A try turned away takes its row back, one whose password
was never checked too; a failed one keeps it.

A user who logs in clears the failures made from the address they logged in from, their
own typos, not those of others: a login may not give an attacker's tries back, raced with
it or not.
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.dispatch import receiver
from django.http import HttpRequest
from django.utils import timezone

from studio.models import LoginFailure

USERNAME_MAX = 150  # the width of auth's username


def login_username_key(username: str) -> str:
    """The one form of a username the limit counts, checks and clears under.

    As auth's login form reads it (stripped, NFKC), and case-folded: `" victim"`, `"victim "`
    or `victim` in full-width letters is the same user to the form, so it must be the same
    to the limit, or each spelling is a fresh set of attempts (and `" victim"` gets in
    while `victim` is locked).
    """
    return unicodedata.normalize("NFKC", username.strip()).casefold().strip()[:USERNAME_MAX]


def login_address(request: HttpRequest) -> str:
    # REMOTE_ADDR, not X-Forwarded-For: a client writes that header itself. Behind a proxy,
    # have the proxy set REMOTE_ADDR.
    return request.META.get("REMOTE_ADDR", "")[:45]


@dataclass
class LoginAttempt:
    id: int
    wait_seconds: int  # 0: it may go ahead
    password_checked: bool = False


def login_attempt_begin(*, username: str, address: str) -> LoginAttempt:
    """Count an attempt at this username from this address, then say whether it may go
    ahead. Turned away (`wait_seconds` > 0), it is no longer counted."""
    window = timedelta(seconds=settings.STUDIO_LOGIN_LOCKOUT_SECONDS)
    now = timezone.now()
    LoginFailure.objects.filter(at__lt=now - window).delete()  # they say nothing any more
    key = login_username_key(username)
    # Committed before the counts below start (no transaction is open around a request).
    attempt = LoginFailure.objects.create(username=key, address=address, at=now)
    recent = LoginFailure.objects.filter(at__gte=now - window).exclude(id=attempt.id)
    waits = []
    for others, limit in (
        (recent.filter(username=key), settings.STUDIO_LOGIN_MAX_FAILURES),
        (recent.filter(address=address), settings.STUDIO_LOGIN_MAX_FAILURES_PER_ADDRESS),
    ):
        # Turned away while `limit` others lie inside the window: until the oldest of the
        # newest `limit` ages out of it.
        newest = list(others.order_by("-at").values_list("at", flat=True)[:limit])
        if len(newest) >= limit:
            waits.append((newest[-1] + window - now).total_seconds())
    if not waits:
        return LoginAttempt(id=attempt.id, wait_seconds=0)
    attempt.delete()
    return LoginAttempt(id=attempt.id, wait_seconds=max(1, math.ceil(max(waits))))


def login_attempt_end(attempt: LoginAttempt) -> None:
    """After the login page answered: an attempt whose password was never checked (an
    incomplete form) is not counted."""
    if not attempt.password_checked:
        LoginFailure.objects.filter(id=attempt.id).delete()


def login_failure_record(*, username: str, address: str) -> None:
    """A password checked elsewhere than on a login page failed."""
    LoginFailure.objects.create(
        username=login_username_key(username), address=address, at=timezone.now()
    )


def login_failures_clear(*, username: str, address: str) -> None:
    LoginFailure.objects.filter(username=login_username_key(username), address=address).delete()


def _attempt_of(request: HttpRequest | None) -> LoginAttempt | None:
    return getattr(request, "login_attempt", None)


@receiver(user_login_failed)
def _on_login_failed(sender, credentials: dict, request: HttpRequest | None = None, **kwargs):
    attempt = _attempt_of(request)
    if attempt is not None:
        attempt.password_checked = True  # its row stays: the failure
    elif request is not None:
        login_failure_record(
            username=str(credentials.get("username", "")), address=login_address(request)
        )


@receiver(user_logged_in)
def _on_logged_in(sender, request: HttpRequest | None, user, **kwargs) -> None:
    attempt = _attempt_of(request)
    if attempt is not None:
        attempt.password_checked = True
    if request is not None:
        # This attempt's own row goes with them.
        login_failures_clear(username=user.get_username(), address=login_address(request))
