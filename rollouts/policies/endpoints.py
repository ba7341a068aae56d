"""Where a batch's model calls go and with which key: an admin-named endpoint, or the CLI's URL.

A batch started from the browser names an endpoint (`studio.models.Endpoint`); its base URL
is recorded on the batch, and the worker sends that endpoint's key (read from the variable
the admin named) to that URL and nowhere else. `rollout --base-url URL` is for operators: a
URL no endpoint has is played with the command's own `OPENAI_API_KEY` when it plays
`--inline`, and with no key at all on a worker (fine for vLLM or Ollama). A URL an endpoint
has always goes with that endpoint's key.

An admin who disables an endpoint (a leaked key, a bill running) stops its key at once: a
call that carries it asks `connection_check` before each request, the first and every
retry, and the episode or probe chunk fails with one line once the endpoint is disabled,
removed, moved to another URL or given another key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from rollouts.policies.base import PolicyUnavailable
from studio.endpoints import endpoint_api_key, endpoint_enabled_first, endpoint_read_since
from studio.models import Endpoint


@dataclass(frozen=True)
class ModelConnection:
    base_url: str
    api_key: str  # "" when no key goes with the calls
    label: str  # how errors name the endpoint: its name, or the URL given on the command line
    # The admin-named endpoint whose key this is, and the variable it was read from; ""
    # when no endpoint's key goes with the calls (a URL given on the command line).
    endpoint: str = ""
    api_key_env: str = ""


class NamesEndpoint(Protocol):
    """What the calls name: a batch's settings, or a chat client's options."""

    @property
    def endpoint(self) -> str: ...

    @property
    def base_url(self) -> str: ...


def model_connection(settings: NamesEndpoint, *, cli_api_key: str = "") -> ModelConnection:
    if not settings.endpoint:
        # A batch that names no endpoint (made before endpoints had names, or by code that
        # passes a URL) still gets the key of the endpoint an admin named for that URL.
        named = chat_endpoint_with_url(settings.base_url) if settings.base_url else None
        if named is not None:
            return _endpoint_connection(named)
        return ModelConnection(settings.base_url, cli_api_key, settings.base_url or "(default)")
    name = settings.endpoint
    endpoint = endpoint_enabled_first(kind=Endpoint.Kind.CHAT, name=name)
    if endpoint is None:
        raise PolicyUnavailable(f"model endpoint {name!r} is not enabled any more")
    if endpoint.base_url != settings.base_url:
        # The batch's record says where its turns came from; it must stay true.
        raise PolicyUnavailable(
            f"model endpoint {name!r} points elsewhere than when this batch was created; "
            "start a new batch"
        )
    return _endpoint_connection(endpoint)


def _endpoint_connection(endpoint: Endpoint) -> ModelConnection:
    return ModelConnection(
        base_url=endpoint.base_url,
        api_key=endpoint_api_key(endpoint),
        label=repr(endpoint.name),
        endpoint=endpoint.name,
        api_key_env=endpoint.api_key_env,
    )


def connection_check(connection: ModelConnection, *, since: float) -> None:
    """Raise `PolicyUnavailable` when the endpoint whose key `connection` holds may no longer
    get it; `since` is when the caller's previous request left (`time.monotonic()`).

    Its key goes nowhere once the endpoint is disabled, removed, or points to another URL.
    Nor once an admin names another key variable: the key in hand is then one the admin
    stopped pairing with this URL (rotated out, most likely, because it leaked), and an
    episode is not switched to a new key half-way (another account, another bill); a new
    batch starts on the new one. Two variables holding the same key change nothing.
    """
    if not connection.endpoint:
        return
    endpoint = endpoint_read_since(name=connection.endpoint, since=since)
    if endpoint is None or endpoint.kind != Endpoint.Kind.CHAT:
        change = "removed"
    elif not endpoint.enabled:
        change = "disabled"
    elif endpoint.base_url != connection.base_url:
        change = "moved to another URL"
    elif (
        endpoint.api_key_env != connection.api_key_env
        and endpoint_api_key(endpoint) != connection.api_key
    ):
        change = "given another key"
    else:
        return
    raise PolicyUnavailable(f"endpoint {connection.endpoint!r} was {change} by an admin")


def chat_endpoint_with_url(base_url: str) -> Endpoint | None:
    """The enabled chat endpoint an admin named for exactly this URL, if any."""
    return endpoint_enabled_first(kind=Endpoint.Kind.CHAT, base_url=base_url)


def endpoint_settings(endpoint: Endpoint) -> dict[str, Any]:
    """The batch options an endpoint fixes (name, URL) or gives defaults for (limits)."""
    return {
        "endpoint": endpoint.name,
        "base_url": endpoint.base_url,
        "concurrency": endpoint.concurrency,
        "requests_per_minute": endpoint.requests_per_minute,
    }
