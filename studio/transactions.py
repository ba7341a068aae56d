"""Transaction settings shared by the writes that choose them."""

from __future__ import annotations

import psycopg
from django.db import connection


def commit_without_flush_wait() -> None:
    """The current transaction's commit does not wait for the WAL flush (PostgreSQL; a no-op
    elsewhere). Only for writes whose loss in a database crash is repaired by the caller's
    own design: each caller says how."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit = off")


def fetch_and_commit(sql: str, params: list) -> tuple | None:
    """Run the transaction's last statement and its COMMIT in one round trip; its first row.

    For a statement taking a row lock that many transactions queue for (the batch row that
    every episode's end counts on): the lock is then held for the statement and the commit,
    on the server, and not across a round trip to a worker thread that may wait milliseconds
    for its interpreter lock before it sends the COMMIT: 64 episodes ending together would
    queue behind each other that way. The caller writes nothing after it.

    Only in the outermost atomic block of a PostgreSQL connection: elsewhere (a savepoint, a
    caller's or a test's transaction, another database) it is a plain statement, and the
    block commits as usual. A failed statement commits nothing: PostgreSQL skips the rest of
    the query string, and the block rolls back. The block's own commit then finds no
    transaction open (psycopg sends none) and runs its on_commit hooks as usual.
    """
    # The one block that commits on exit: not nested, not a savepoint, not a caller's own
    # transaction (autocommit turned off by hand), not already doomed to roll back.
    if (
        connection.vendor != "postgresql"
        or len(connection.atomic_blocks) != 1
        or connection.savepoint_ids
        or not connection.commit_on_exit
        or connection.needs_rollback
    ):
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()
    connection.ensure_connection()
    # Parameters bound on this side (a client cursor): a query string of two statements
    # goes in one message, which server-side binding does not allow.
    with connection.wrap_database_errors, psycopg.ClientCursor(connection.connection) as cursor:
        cursor.execute(f"{sql}; COMMIT", params)
        return cursor.fetchone()
