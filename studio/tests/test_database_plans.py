"""Statements a connection repeats are prepared on the server, and planned for each run's
values: a generic plan, which PostgreSQL may pick after five runs of a prepared statement,
can read every turn for the turn list's errors sorted by reward."""

from __future__ import annotations

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db

# A statement of its own, so that the server's list of prepared statements names it alone.
PROBE = "SELECT count(*) FROM rollouts_turn WHERE reward = %s AND index >= %s /* plan probe */"


def test_repeated_statements_are_prepared_and_never_planned_generically():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's plan cache")
    with connection.cursor() as cursor:
        for run in range(12):
            cursor.execute(PROBE, [float(run % 3), run])
            assert cursor.fetchone() == (0,)
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE %s",
            ["%plan probe%"],
        )
        plans = cursor.fetchall()
    # Prepared once (after the second run, STUDIO_DB_PREPARE_THRESHOLD), then planned for
    # each of the runs after it with their own values.
    assert len(plans) == 1
    generic, custom = plans[0]
    assert generic == 0
    assert custom >= 10
