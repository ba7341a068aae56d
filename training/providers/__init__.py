"""Training providers, each declared once: a `ProviderKind` at the bottom of its client's
module (`synth.py`, `openai.py`), read by everything else.

The form's and `submit_training --provider`'s choices, the job's and endpoint's choice lists,
the CLI's key variable and default URL, and the rows uploaded all ask the kind rather than
compare its name. Adding a provider is one module here and one import line at the bottom of
this file (docs/layout.md, "How to add a training provider").
"""

from __future__ import annotations

from collections.abc import Callable

from training.providers.base import Provider, ProviderError
from training.providers.kinds import (
    ProviderKind,
    provider_kind,
    provider_kinds,
    provider_names,
    register,
    unregister,
)


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
    return provider_kind(name).client(
        base_url=base_url, api_key=api_key, max_retries=max_retries, before_request=before_request
    )


__all__ = [
    "Provider",
    "ProviderError",
    "ProviderKind",
    "provider_for",
    "provider_kind",
    "provider_kinds",
    "provider_names",
    "register",
    "unregister",
]

# The providers: registered as imported, the order the form and `--provider` list them.
# isort: off
from training.providers import synth  # noqa: E402, F401
from training.providers import openai  # noqa: E402, F401
# isort: on
