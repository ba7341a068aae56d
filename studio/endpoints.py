"""Reading and seeding admin-named endpoints (`studio.models.Endpoint`).

Everything that sends a key asks this module for it, by endpoint: the key is looked up in
the environment variable the admin named, and only ever paired with that endpoint's URL.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.db.models import QuerySet

from studio.key_names import key_env_name_allowed
from studio.model_names import allowed_model_names
from studio.models import Endpoint

logger = logging.getLogger(__name__)

OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"


class EndpointError(ValueError):
    """An endpoint name or model that cannot be used; the message says why in one line."""


def endpoints_enabled(*, kind: str) -> QuerySet[Endpoint]:
    return Endpoint.objects.filter(kind=kind, enabled=True).order_by("name")


def endpoint_enabled_first(
    *, kind: str, name: str | None = None, base_url: str | None = None
) -> Endpoint | None:
    """`endpoints_enabled(kind=kind).filter(name=name, base_url=base_url).first()` (each
    condition only when given), in SQL.

    Every episode looks its endpoint up as it starts, 64 at once sharing a worker's cores,
    and the ORM's building of that query is a visible share of a threaded worker's CPU in
    `benchmarks/vlm_concurrency`. `test_endpoints` checks that both give the same endpoint.
    """
    conditions, params = ["kind = %s", "enabled"], [kind]
    if name is not None:
        conditions.append("name = %s")
        params.append(name)
    if base_url is not None:
        conditions.append("base_url = %s")
        params.append(base_url)
    table = Endpoint._meta.db_table
    sql = f"SELECT * FROM {table} WHERE {' AND '.join(conditions)} ORDER BY name LIMIT 1"
    return next(iter(Endpoint.objects.raw(sql, params)), None)


def endpoint_get(*, name: str, kind: str) -> Endpoint:
    endpoint = endpoint_enabled_first(kind=kind, name=name)
    if endpoint is None:
        known = ", ".join(endpoints_enabled(kind=kind).values_list("name", flat=True))
        raise EndpointError(
            f"endpoint: no {kind} endpoint named {name!r}; "
            + (f"known: {known}" if known else "an admin adds them under /admin/")
        )
    return endpoint


# How old a read of an endpoint may be for a call that sends its key: an admin's disable
# reaches the calls in flight within this (and after at most one more call each).
ENDPOINT_RECHECK_SECONDS = 1.0

_endpoints_read: dict[str, tuple[float, Endpoint | None]] = {}
_endpoints_read_lock = threading.Lock()


def endpoint_read_since(*, name: str, since: float) -> Endpoint | None:
    """The endpoint named `name` (None when there is none) as the database had it at a moment
    after `since` (a `time.monotonic()`) and at most `ENDPOINT_RECHECK_SECONDS` ago.

    Asked before every request that carries an endpoint's key. One read serves every thread
    of the process whose `since` it follows, so 64 episodes on one endpoint cost a few small
    queries a second, not one a call; a caller passing the moment of its previous request
    never sends two requests on a read older than the first of them. Only the fields a call
    needs are read; the instance is not for saving.
    """
    read = _endpoints_read.get(name)
    if read is not None and _read_fresh(read[0], since=since):
        return read[1]
    with _endpoints_read_lock:
        read = _endpoints_read.get(name)  # another thread may have read it meanwhile
        if read is not None and _read_fresh(read[0], since=since):
            return read[1]
        asked = time.monotonic()  # the row seen is as it was at this moment or later
        endpoint = (
            Endpoint.objects.only("name", "kind", "base_url", "api_key_env", "enabled")
            .filter(name=name)
            .first()
        )
        _endpoints_read[name] = (asked, endpoint)
        return endpoint


def _read_fresh(asked: float, *, since: float) -> bool:
    return asked >= since and time.monotonic() - asked <= ENDPOINT_RECHECK_SECONDS


def endpoint_check_model(*, endpoint: Endpoint, model: str) -> None:
    if endpoint.allows_model(model):
        return
    names = allowed_model_names(endpoint.allowed_models)
    allowed = (
        f"allowed: {', '.join(names)}"
        if names
        else "its allowed models cannot be read; an admin corrects them under /admin/"
    )
    raise EndpointError(f"model: {model!r} is not allowed on endpoint {endpoint.name!r}; {allowed}")


def endpoint_api_key(endpoint: Endpoint) -> str:
    """The key for this endpoint from the worker's environment, or "" when none is named.

    Also "" for a variable the rule (`studio.key_names`) does not allow: a row saved before
    the rule, or written straight into the database, must not send `SECRET_KEY` anywhere.
    """
    if not endpoint.api_key_env:
        return ""
    if not key_env_name_allowed(endpoint.api_key_env):
        logger.warning(
            "endpoint %r: key variable %r is not allowed (STUDIO_KEY_ENV_PATTERN or a server "
            "secret); no key sent",
            endpoint.name,
            endpoint.api_key_env,
        )
        return ""
    return os.environ.get(endpoint.api_key_env, "")


def endpoint_key_set(endpoint: Endpoint) -> bool | None:
    """Whether this endpoint's key is set here (never its value); None when it needs none.

    A variable the rule refuses counts as not set, whether or not it exists: the admin tells
    nothing about the server's other variables.
    """
    if not endpoint.api_key_env:
        return None
    return key_env_name_allowed(endpoint.api_key_env) and bool(os.environ.get(endpoint.api_key_env))


def endpoints_seed_defaults(*, say: Callable[[str], object] | None = None) -> list[Endpoint]:
    """Create the endpoints the environment describes (`OPENAI_BASE_URL` or `OPENAI_API_KEY`,
    `SYNTH_BACKEND_URL`), each said in one line through `say` (name, URL, key variable; never
    the key): an endpoint nobody named by hand may be where billed calls go.

    Only creates: an admin's later edits to an endpoint of the same name are kept.
    """
    wanted = []
    if settings.OPENAI_BASE_URL or settings.OPENAI_API_KEY:
        # A key alone means OpenAI itself, as it did for the client library.
        base_url = settings.OPENAI_BASE_URL or OPENAI_DEFAULT_BASE_URL
        source = "OPENAI_BASE_URL" if settings.OPENAI_BASE_URL else "OPENAI_API_KEY"
        wanted.append(("default", Endpoint.Kind.CHAT, base_url, "OPENAI_API_KEY", source))
    if settings.SYNTH_BACKEND_URL:
        wanted.append(
            (
                "synth",
                Endpoint.Kind.SYNTH,
                settings.SYNTH_BACKEND_URL,
                "SYNTH_API_KEY",
                "SYNTH_BACKEND_URL",
            )
        )
    created = []
    for name, kind, base_url, key_env, source in wanted:
        endpoint, was_created = Endpoint.objects.get_or_create(
            name=name, defaults={"kind": kind, "base_url": base_url, "api_key_env": key_env}
        )
        if was_created:
            created.append(endpoint)
            if say is not None:
                say(
                    f"Named endpoint {endpoint_described(endpoint)}, as {source} is set; "
                    "change or disable it under /admin/."
                )
    return created


def endpoint_save(
    *, name: str, kind: str, base_url: str, key_env: str = "", enabled: bool = True
) -> tuple[Endpoint, bool]:
    """Create the endpoint `name`, or update its kind, URL, key variable and enabled flag
    (its models, limits and prices are kept); whether it was created.

    Checked by the model's own rules, as the admin checks them (`full_clean`: a slug for a
    name, an http(s) URL, an allowed key variable): refused with a ValidationError, nothing
    written.
    """
    endpoint = Endpoint.objects.filter(name=name).first()
    created = endpoint is None
    if endpoint is None:
        endpoint = Endpoint(name=name)
    endpoint.kind = kind
    endpoint.base_url = base_url
    endpoint.api_key_env = key_env
    endpoint.enabled = enabled
    endpoint.full_clean()
    endpoint.save()
    return endpoint, created


def endpoint_described(endpoint: Endpoint) -> str:
    """One line for an endpoint, never its key: `default → https://api.openai.com/v1 (chat,
    key from OPENAI_API_KEY)`."""
    key = f"key from {endpoint.api_key_env}" if endpoint.api_key_env else "no key"
    disabled = ", disabled" if not endpoint.enabled else ""
    return f"{endpoint.name} → {endpoint.base_url} ({endpoint.kind}, {key}{disabled})"


def endpoint_preselected(*, kind: str) -> str | None:
    """The endpoint a form picks before its user does: the only enabled one of its kind, and
    none when there are several, for a choice made for the user could send billed calls to
    a server nobody chose."""
    names = list(endpoints_enabled(kind=kind).values_list("name", flat=True)[:2])
    return names[0] if len(names) == 1 else None
