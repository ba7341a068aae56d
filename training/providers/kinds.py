"""The `ProviderKind` declaration and its registry (the package's `__init__` loads the
providers)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from training.config import ConfigKeys, schema_add, schema_remove
from training.providers.base import Provider, ProviderError


@dataclass(frozen=True)
class ProviderKind:
    """What a training provider is: everything the studio asks of it."""

    name: str
    # The client: built with base_url, api_key, max_retries and before_request.
    client: Callable[..., Provider]
    # The environment variable holding the CLI's key (the browser uses its endpoint's).
    key_env: str
    # The base URL when the command line gives none ("" when there is no default).
    default_url: Callable[[], str]
    # The setting that gives the default URL, named when it is missing.
    url_setting: str
    # The export row format its files are uploaded in (curation.row_formats).
    row_format: str
    # The admin-named endpoints (studio.Endpoint kind) a browser job may pick for it ("": a
    # provider that `needs_url` no more has none).
    endpoint_kind: str
    endpoint_label: str
    # TOML keys it reads beyond the shared ones (training.config.SCHEMA), by section.
    config_keys: ConfigKeys = field(default_factory=dict)
    # False: it is reached through no URL and with no key (it trains on our own machines), so
    # a submission asks for neither and names no endpoint.
    needs_url: bool = True
    # False: nothing is uploaded; it trains on the version's Hugging Face export as stored.
    uploads_files: bool = True
    # The settings of a config it cannot honour, one line each (refused at submission).
    refusals: Callable[[dict[str, dict]], list[str]] | None = None
    # One plain sentence the job form and the job page show of where its jobs run.
    notice: str = ""


_KINDS: dict[str, ProviderKind] = {}


def register(kind: ProviderKind) -> ProviderKind:
    """Add a provider (its module's one call), its endpoint kind to studio's list and its
    own TOML keys to the config's schema."""
    from studio.models import endpoint_kind_add

    if kind.name in _KINDS:
        raise ValueError(f"training provider {kind.name!r} is registered twice")
    schema_add(kind.config_keys)
    _KINDS[kind.name] = kind
    if kind.endpoint_kind:
        endpoint_kind_add(kind.endpoint_kind, kind.endpoint_label)
    return kind


def unregister(name: str) -> None:
    """Remove a provider (tests that register a throwaway one)."""
    from studio.models import endpoint_kind_remove

    kind = _KINDS.pop(name, None)
    if kind is not None:
        if kind.endpoint_kind:
            endpoint_kind_remove(kind.endpoint_kind)
        schema_remove(kind.config_keys)


def provider_kinds() -> tuple[ProviderKind, ...]:
    return tuple(_KINDS.values())


def provider_names() -> tuple[str, ...]:
    return tuple(_KINDS)


def provider_kind(name: str) -> ProviderKind:
    """The provider called `name`; ProviderError naming the registered ones otherwise."""
    found = _KINDS.get(name)
    if found is None:
        raise ProviderError(f"provider: {name!r} is not one of {', '.join(_KINDS)}")
    return found
