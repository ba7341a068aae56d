"""What the benchmark scripts share: a Django set-up on a database of their own."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Benchmarks that time a page with its cache emptied first (`cache.clear()`, which on Redis
# empties a whole database) keep their cache in a Redis database of their own, never the
# broker's. `BENCH_CACHE_URL` names another.
BENCH_CACHE_URL = os.environ.get("BENCH_CACHE_URL", "redis://127.0.0.1:6379/15")


def use_own_cache() -> None:
    """Point Django's cache at the benchmarks' own Redis database (before `django.setup()`)."""
    os.environ["REDIS_URL"] = BENCH_CACHE_URL


def bench_database(default: str) -> str:
    """The benchmark's own database: `BENCH_DATABASE` when set (runs side by side), else
    `default`."""
    return os.environ.get("BENCH_DATABASE") or default


def setup_django(database: str) -> None:
    """Point Django at a fresh PostgreSQL database `database` (created and migrated here)."""
    database = bench_database(database)
    sys.path.insert(0, str(ROOT))
    base = os.environ.get("BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432")
    os.environ["DATABASE_URL"] = f"{base}/{database}"
    os.environ.setdefault("SECRET_KEY", "benchmark-only")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")
    import psycopg

    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{database}"')
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
