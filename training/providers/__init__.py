"""Training providers behind one interface (`base.Provider`); one module each."""

from __future__ import annotations

from collections.abc import Callable

from training.providers.base import Provider, ProviderError

PROVIDERS = ("synth", "openai")


def provider_for(
    *,
    name: str,
    base_url: str,
    api_key: str,
    max_retries: int | None = None,
    before_request: Callable[[], None] | None = None,
) -> Provider:
    """`max_retries`: of a call that failed with 429, 5xx or a network error (default:
    STUDIO_TRAINING_MAX_RETRIES; a poll asks for none, the next poll being its retry).
    `before_request`: called before every request, each retry included; what it raises
    (a `ProviderError`) stops that request unsent."""
    options = {
        "base_url": base_url,
        "api_key": api_key,
        "max_retries": max_retries,
        "before_request": before_request,
    }
    if name == "synth":
        from training.providers.synth import SynthProvider

        return SynthProvider(**options)
    if name == "openai":
        from training.providers.openai import OpenAIProvider

        return OpenAIProvider(**options)
    raise ProviderError(f"provider: {name!r} is not one of {', '.join(PROVIDERS)}")


__all__ = ["PROVIDERS", "Provider", "ProviderError", "provider_for"]
