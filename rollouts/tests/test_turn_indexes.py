"""The turn list's and datasets' filters are served by indexes, not by reading every turn."""

from __future__ import annotations

import importlib
from dataclasses import replace

import pytest
from django.db import connection

from rollouts.game.crafter_env import ACHIEVEMENTS
from rollouts.models import Episode, Turn
from rollouts.review.selectors import TURN_LIST_ORDER
from rollouts.review.turn_selection import EVERY_TURN, TurnSelection, turns_selected
from rollouts.tests.helpers import record_batch

pytestmark = pytest.mark.django_db


def _plan(queryset, *, bitmap_only: bool = False) -> str:
    """PostgreSQL's plan with sequential scans priced out: which index can serve the query.

    `bitmap_only` also prices out plain index scans, which can walk any index and filter:
    what is left must take its rows from an index that answers the condition itself.
    """
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        if bitmap_only:
            cursor.execute("SET LOCAL enable_indexscan = off")
            cursor.execute("SET LOCAL enable_indexonlyscan = off")
        cursor.execute(f"EXPLAIN {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.fixture
def played(db):
    """20,480 turns in 80 episodes (one recorded, the rest copied in SQL): enough rows for
    the planner to choose as it would on a real table, few enough for a test."""
    batch = record_batch(policy="scripted", seeds=(1,), steps=4)
    frame_id = batch.episodes.get().frames.values_list("id", flat=True).first()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO rollouts_episode (batch_id, seed, status, steps, total_reward, "
            "achievements, achievement_count, tool_calls, model_calls, model_errors, "
            "model_retries, bad_outputs, prompt_tokens, completion_tokens, error, attempts, "
            "claim_token, fork_prefix_turns, fork_with_correction, sample) "
            "SELECT %s, 100 + e, 'finished', 256, 1, CASE WHEN e = 7 THEN "
            "'{\"collect_wood\": 3}'::jsonb ELSE '{}'::jsonb END, 0, 0, 0, 0, 0, 0, 0, 0, "
            "'', 1, '', 0, false, 0 FROM generate_series(0, 79) AS e",
            [batch.id],
        )
        cursor.execute(
            'INSERT INTO rollouts_turn (episode_id, "index", frame_id, observation_text, '
            "request_messages, reasoning_text, tool_calls, actions, reward, "
            "achievements_unlocked, error, error_kind, finish_reason, text_fallback, "
            "prompt_tokens, completion_tokens, latency_ms, retries, flagged, note, truncated) "
            "SELECT e.id, i, %s, 'obs', '[]', '', '[]', '[\"noop\"]', 0, "
            "CASE WHEN i = 3 AND e.seed = 107 THEN '[\"collect_wood\"]'::jsonb "
            "ELSE '[]'::jsonb END, CASE WHEN i = 3 THEN 'timeout' ELSE '' END, '', '', "
            "false, 0, 0, 0, 0, i = 5 AND e.seed %% 10 = 0, '', '{}' "
            "FROM rollouts_episode e, generate_series(0, 255) AS i WHERE e.batch_id = %s "
            "AND e.seed >= 100",
            [frame_id, batch.id],
        )
        cursor.execute("ANALYZE")
    return batch


def _page(filters: TurnSelection):
    return turns_selected(filters, for_pages=True).order_by(*TURN_LIST_ORDER)[:51]


def test_it_reads_the_default_page_in_index_order(played):
    plan = _page(EVERY_TURN)
    assert "turn_list_order_idx" in _plan(plan)
    assert "Sort" not in _plan(plan)


def test_it_reads_flagged_and_failed_turns_from_partial_indexes(played):
    assert "turn_list_flagged_idx" in _plan(_page(replace(EVERY_TURN, flagged="only")))
    assert "turn_list_error_idx" in _plan(_page(replace(EVERY_TURN, has_error="yes")))


def test_it_reads_unlocked_achievements_from_their_own_index_in_page_order(played):
    plan = _plan(_page(replace(EVERY_TURN, turn_unlocked=("collect_wood",))))
    assert "turn_unlocked_collect_wood_idx" in plan
    assert "Sort" not in plan  # walked in page order, stopped at the page size
    combined = replace(
        EVERY_TURN, models=("",), flagged="exclude", has_error="no", turn_unlocked=("eat_cow",)
    )
    assert "turn_unlocked_eat_cow_idx" in _plan(_page(combined))
    required = turns_selected(TurnSelection(require_achievements=("collect_wood",)))
    # The datasets' required achievements are the episode's: `?&` on episode.achievements.
    episodes = Episode.objects.filter(achievements__has_keys=["collect_wood"]).order_by()
    assert "episode_achievements_gin" in _plan(episodes.only("id"), bitmap_only=True)
    # And they still answer correctly.
    assert turns_selected(replace(EVERY_TURN, turn_unlocked=("collect_wood",))).count() == 1
    assert required.count() == 256


def test_every_achievement_has_its_index(played):
    migration = importlib.import_module("rollouts.migrations.0014_turn_selection_indexes")
    assert migration.ACHIEVEMENTS == ACHIEVEMENTS
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'rollouts_turn'")
        names = {row[0] for row in cursor.fetchall()}
    assert {f"turn_unlocked_{name}_idx" for name in ACHIEVEMENTS} <= names


def test_it_reads_rewarded_and_penalised_turns_from_partial_indexes(played):
    assert "turn_list_reward_positive_idx" in _plan(_page(replace(EVERY_TURN, reward="positive")))
    assert "turn_list_reward_negative_idx" in _plan(_page(replace(EVERY_TURN, reward="negative")))


def test_it_searches_text_through_trigram_indexes(played):
    # Case-insensitive substrings of three columns: one trigram index each, or'ed bitmaps.
    plan = _plan(_page(replace(EVERY_TURN, search="Diamond")), bitmap_only=True)
    for index in ("turn_model_text_trgm", "turn_note_trgm", "turn_observation_text_trgm"):
        assert index in plan
    Turn.objects.filter(episode__seed=107, index=9).update(note="found a DIAMOND here")
    found = turns_selected(replace(EVERY_TURN, search="diamond"))
    assert list(found.values_list("episode__seed", "index")) == [(107, 9)]


def test_it_reads_a_models_turns_from_its_episodes_on_not_from_the_newest_turn(played):
    # The episodes' ids are an index condition, not a filter on every turn walked.
    plan = _plan(_page(replace(EVERY_TURN, models=("",), flagged="only")))
    assert "turn_list_flagged_idx" in plan
    assert "Index Cond: (episode_id = ANY (" in plan


def _sorted_page(filters: TurnSelection, sort: str):
    """The keys query of the turn list's first page in `sort`'s order, as it runs."""
    from django.test.utils import CaptureQueriesContext

    from rollouts.review.selectors import turn_list_page

    with CaptureQueriesContext(connection) as queries:
        turn_list_page(selection=filters, sort=sort, size=50)
    keys = next(q["sql"] for q in queries.captured_queries if '"index" AS "index"' in q["sql"])
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {keys}")
        return "\n".join(row[0] for row in cursor.fetchall())


def test_it_reads_pages_sorted_by_other_columns_off_indexes_in_their_order(played):
    model = replace(EVERY_TURN, models=("",))
    # By seed: the episodes walked in seed order, each one's turns read, then sorted by turn
    # index within the episode only (an incremental sort), never every match.
    plan = _sorted_page(model, "seed")
    assert "episode_seed_order_idx" in plan and "Incremental Sort" in plan
    assert "episode_batch_order_idx" in _sorted_page(model, "-batch")
    assert "turn_sort_index_idx" in _sorted_page(EVERY_TURN, "turn")
    assert "turn_sort_index_desc_idx" in _sorted_page(EVERY_TURN, "-turn")
    # By reward, value by value: a value's turns of the matching episodes, episode by episode
    # (on this table, where nearly every turn's reward is 0, off the list's own index).
    plan = _sorted_page(model, "reward")
    assert "Index Cond: (episode_id = ANY (" in plan
    assert "Sort  (" not in plan.replace("Incremental Sort", "")  # within an episode at most
    assert "Sort" not in _sorted_page(EVERY_TURN, "-reward")  # each value read in order
