"""Request checks every page shares, before any view or form sees the request."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render
from django.urls import reverse

from studio.login_throttle import login_address, login_attempt_begin, login_attempt_end


def reject_nul_bytes(get_response: Callable[[HttpRequest], HttpResponse]):
    """400 for a NUL byte in the path or the query string.

    PostgreSQL cannot hold NUL in text: a filter like the admin's `?status__exact=%00` went
    straight into a query and came back a 500. Forms refuse NUL on their own; addresses are
    refused here, once for every view.
    """

    def middleware(request: HttpRequest) -> HttpResponse:
        if "\x00" in request.path or any(
            "\x00" in key or any("\x00" in value for value in values)
            for key, values in request.GET.lists()
        ):
            return HttpResponseBadRequest(
                "NUL bytes are not allowed in the address.", content_type="text/plain"
            )
        return get_response(request)

    return middleware


def throttle_logins(get_response: Callable[[HttpRequest], HttpResponse]):
    """429 for a login attempt while its username or address has failed too often.

    Both doors: the studio's login page and the admin's. The attempt is counted here,
    before the form checks its password (`studio.login_throttle`), so that tries sent at
    once are counted as they come, not after they all got through.
    """

    def middleware(request: HttpRequest) -> HttpResponse:
        if request.method != "POST" or request.path not in _login_paths():
            return get_response(request)
        attempt = login_attempt_begin(
            username=request.POST.get("username", ""), address=login_address(request)
        )
        if attempt.wait_seconds:
            wait = attempt.wait_seconds
            minutes = max(1, round(wait / 60))
            message = (
                f"Too many failed logins for this user or from this address; "
                f"try again in {minutes} minute{'s' if minutes != 1 else ''}."
            )
            response = render(
                request,
                "registration/login.html",
                {"form": AuthenticationForm(request), "throttled": message},
                status=429,
            )
            response["Retry-After"] = str(wait)
            return response
        # The auth signals mark on it whether the password was checked, and how it went.
        request.login_attempt = attempt  # type: ignore[attr-defined]
        try:
            return get_response(request)
        finally:
            login_attempt_end(attempt)

    return middleware


def _login_paths() -> set[str]:
    return {reverse("login"), reverse("admin:login")}
