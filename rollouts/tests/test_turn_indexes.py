"""The turn list's and datasets' filters are served by indexes, not by reading every turn."""

from __future__ import annotations

import pytest
from django.db import connection

from datasets.filters import DatasetFilters, turn_queryset
from rollouts.models import Turn
from rollouts.selectors_review import TURN_LIST_ORDER, TurnFilters, turns_filtered
from rollouts.tests.helpers import record_batch

pytestmark = pytest.mark.django_db


def _plan(queryset) -> str:
    """PostgreSQL's plan with sequential scans priced out: which index can serve the query."""
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.fixture
def played(db):
    batch = record_batch(policy="scripted", seeds=(1, 2), steps=20)
    Turn.objects.filter(episode__batch=batch, index=3).update(
        achievements_unlocked=["collect_wood"], flagged=True, error="timeout"
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return batch


def _page(filters: TurnFilters):
    return turns_filtered(filters=filters).order_by(*TURN_LIST_ORDER)[:51]


def test_it_reads_the_default_page_in_index_order(played):
    plan = _page(TurnFilters())
    assert "turn_list_order_idx" in _plan(plan)
    assert "Sort" not in _plan(plan)


def test_it_reads_flagged_and_failed_turns_from_partial_indexes(played):
    assert "turn_list_flagged_idx" in _plan(_page(TurnFilters(flagged="only")))
    assert "turn_list_error_idx" in _plan(_page(TurnFilters(has_error="yes")))


def test_it_finds_unlocked_achievements_through_gin(played):
    assert "turn_unlocked_gin" in _plan(_page(TurnFilters(achievement="collect_wood")))
    required = turn_queryset(DatasetFilters(require_achievements=("collect_wood",)))
    assert "episode_achievements_gin" in _plan(required)
    # And they still answer correctly.
    assert turns_filtered(filters=TurnFilters(achievement="collect_wood")).count() == 2
