"""Where a batch's model calls go and with which key: an admin-named endpoint, or the CLI's URL.

A batch started from the browser names an endpoint (`studio.models.Endpoint`); its base URL
is recorded on the batch, and the worker sends that endpoint's key (read from the variable
the admin named) to that URL and nowhere else. `rollout --base-url URL` is for operators: a
URL no endpoint has is played with the command's own `OPENAI_API_KEY` when it plays
`--inline`, and with no key at all on a worker (fine for vLLM or Ollama). A URL an endpoint
has always goes with that endpoint's key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rollouts.policies.base import PolicyUnavailable
from rollouts.rollout_settings import RolloutSettings
from studio.endpoints import endpoint_api_key, endpoint_enabled_first
from studio.models import Endpoint


@dataclass(frozen=True)
class ModelConnection:
    base_url: str
    api_key: str  # "" when no key goes with the calls
    label: str  # how errors name the endpoint: its name, or the URL given on the command line


def model_connection(settings: RolloutSettings, *, cli_api_key: str = "") -> ModelConnection:
    if not settings.endpoint:
        # A batch that names no endpoint (made before endpoints had names, or by code that
        # passes a URL) still gets the key of the endpoint an admin named for that URL.
        named = chat_endpoint_with_url(settings.base_url) if settings.base_url else None
        if named is not None:
            return ModelConnection(named.base_url, endpoint_api_key(named), repr(named.name))
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
    return ModelConnection(endpoint.base_url, endpoint_api_key(endpoint), repr(name))


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
