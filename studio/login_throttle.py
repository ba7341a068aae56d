"""A small rate limit on logins, per username and per address, for both login pages.

Failures are rows (`LoginFailure`), so the limit holds across web processes with any
database, the demo's SQLite included, and needs no cache server. A user who logs in clears
their own failures; an address is only freed by time.
"""

from __future__ import annotations

import math
import unicodedata
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


def login_wait_seconds(*, username: str, address: str) -> int:
    """Seconds until this username, from this address, may try again; 0 = now."""
    window = timedelta(seconds=settings.STUDIO_LOGIN_LOCKOUT_SECONDS)
    now = timezone.now()
    recent = LoginFailure.objects.filter(at__gte=now - window)
    waits = []
    for failures, limit in (
        (recent.filter(username=login_username_key(username)), settings.STUDIO_LOGIN_MAX_FAILURES),
        (recent.filter(address=address), settings.STUDIO_LOGIN_MAX_FAILURES_PER_ADDRESS),
    ):
        # Locked while `limit` failures lie inside the window: until the oldest of them ages
        # out of it.
        newest = list(failures.order_by("-at").values_list("at", flat=True)[:limit])
        if len(newest) >= limit:
            waits.append((newest[-1] + window - now).total_seconds())
    return max(0, math.ceil(max(waits))) if waits else 0


def login_failure_record(*, username: str, address: str) -> None:
    now = timezone.now()
    LoginFailure.objects.create(username=login_username_key(username), address=address, at=now)
    # Old rows say nothing any more.
    window = timedelta(seconds=settings.STUDIO_LOGIN_LOCKOUT_SECONDS)
    LoginFailure.objects.filter(at__lt=now - window).delete()


def login_failures_clear(*, username: str) -> None:
    LoginFailure.objects.filter(username=login_username_key(username)).delete()


@receiver(user_login_failed)
def _on_login_failed(sender, credentials: dict, request: HttpRequest | None = None, **kwargs):
    if request is not None:
        login_failure_record(
            username=str(credentials.get("username", "")), address=login_address(request)
        )


@receiver(user_logged_in)
def _on_logged_in(sender, request: HttpRequest | None, user, **kwargs) -> None:
    login_failures_clear(username=user.get_username())
