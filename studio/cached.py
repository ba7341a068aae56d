"""Values computed once and kept in Django's cache (Redis when configured, shared by every
process), for reads whose answer only changes when their key does.

An unreachable cache costs a miss, never the page: the value is computed and served.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from django.core.cache import cache
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)

T = TypeVar("T")


def cached(key: str, compute: Callable[[], T], *, seconds: int) -> T:
    """`compute()`, or what it returned for `key` within the last `seconds`.

    The key must name everything the value depends on: entries are never invalidated.
    """
    try:
        value = cache.get(key)
    except (RedisError, OSError) as exc:
        logger.info("cache unreachable: %s", exc)
        return compute()
    if value is None:
        value = compute()
        try:
            cache.set(key, value, seconds)
        except (RedisError, OSError) as exc:
            logger.info("cache unreachable: %s", exc)
    return value
