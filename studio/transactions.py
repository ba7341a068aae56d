"""Transaction settings shared by the writes that choose them."""

from __future__ import annotations

from django.db import connection


def commit_without_flush_wait() -> None:
    """The current transaction's commit does not wait for the WAL flush (PostgreSQL; a no-op
    elsewhere). Only for writes whose loss in a database crash is repaired by the caller's
    own design: each caller says how."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit = off")
