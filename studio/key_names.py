"""Which environment variables may hold an endpoint's key (`docs/configuration.md`, "Secrets
and logins").

An endpoint's key is read from the variable its row names and sent to its URL. A row naming
`SECRET_KEY` or `DATABASE_URL` would send the server's own secrets to whoever runs that URL,
so a name must match `settings.STUDIO_KEY_ENV_PATTERN` and must not be one of the names
below, whatever the pattern says. The rule is checked when an endpoint is saved
(`key_env_name_validate`, the model field's validator) and again each time a key is read
(`key_env_name_allowed`, in `studio.endpoints.endpoint_api_key`), so a row written before
the rule, or straight into the database, still sends nothing.

Neither check looks at the environment: whether a name is allowed never depends on whether
that variable exists on the server, so the answer reveals nothing about it.
"""

from __future__ import annotations

import re
from functools import lru_cache

from django.conf import settings
from django.core.exceptions import ValidationError

# The server's own secrets, never an endpoint's key whatever the pattern: Django's and the
# studio's (settings.py), the database, broker and cache URLs (they carry passwords), the
# S3 credentials django-storages and boto read, the demo user's password, libpq's password.
KEY_ENV_DENIED = frozenset(
    {
        "SECRET_KEY",
        "DJANGO_SECRET_KEY",
        "DATABASE_URL",
        "CELERY_BROKER_URL",
        "CELERY_RESULT_BACKEND",
        "REDIS_URL",
        "CACHE_URL",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_ACCESS_KEY_ID",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_S3_SECRET_ACCESS_KEY",
        "AWS_S3_ACCESS_KEY_ID",
        "AWS_S3_SESSION_TOKEN",
        "DEMO_PASSWORD",
        "PGPASSWORD",
    }
)


@lru_cache(maxsize=8)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def key_env_pattern() -> str:
    """The operator's pattern; by default names ending in _KEY (so _API_KEY too)."""
    return settings.STUDIO_KEY_ENV_PATTERN


def key_env_name_allowed(name: str) -> bool:
    """Whether an endpoint may name this variable as its key's (the whole name must match)."""
    if not name or name.upper() in KEY_ENV_DENIED:
        return False
    return _compiled(key_env_pattern()).fullmatch(name) is not None


def key_env_name_validate(value: str) -> None:
    """The model field's validator: the rule, stated in the error; empty means no key."""
    if value and not key_env_name_allowed(value):
        raise ValidationError(
            "Not allowed as a key variable: the name must match STUDIO_KEY_ENV_PATTERN "
            "(%(pattern)s) and must not be one of the server's own secrets (Django's secret "
            "key, the database, broker and cache URLs, storage credentials).",
            code="key_env_not_allowed",
            params={"pattern": key_env_pattern()},
        )
