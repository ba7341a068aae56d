"""One turn selection for the turn list and datasets: each option picks exactly the turns it
picked before the two filters were merged.

The world is built by hand, eleven turns in four episodes; every expected answer below was
worked out from the table in `world`'s docstring, not by running the code.
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from urllib.parse import parse_qs

import pytest
from django.utils import timezone

from rollouts.models import Episode, Frame, RolloutBatch, Turn, TurnBulkFlag, TurnRelabel
from rollouts.review.forms import turn_list_query
from rollouts.review.turn_selection import EVERY_TURN, FilterError, TurnSelection, turns_selected

pytestmark = pytest.mark.django_db

_bulk_flag_migration = importlib.import_module("rollouts.migrations.0013_turn_bulk_flag_selection")

ALL = {"E1.0", "E1.1", "E1.2", "E1.3", "E2.0", "E2.1", "E2.2", "E3.0", "E3.1", "E3.2", "E4.0"}


@pytest.fixture
def world(editor) -> dict[str, object]:
    """Batches P (openai, m-a), Q (scripted), R (openai, m-b); episodes and turns:

    E1  P seed 1, episode unlocked collect_wood + place_table (2 unique), reward 2
        E1.0  reward 0, observation "grass all around"
        E1.1  unlocked collect_wood, reward 1, model text "Chop the TREE"
        E1.2  error "timeout" (kind timeout), flagged
        E1.3  unlocked place_table, reward 1, note "nice table"
    E2  P seed 2, episode unlocked collect_wood (1 unique), reward 1
        E2.0  unlocked collect_wood, reward 1, actions read from prose (text_fallback)
        E2.1  error kind "bad_json" with no error message, reward -0.1
        E2.2  flagged, no model text at all
    E3  Q seed 1, a fork replaying 2 turns (fork_prefix_turns 2), nothing unlocked
        E3.0  observation "a tree here" (prefix)
        E3.1  (prefix)
        E3.2  flagged, text_fallback but relabeled by a reviewer
    E4  R seed 7, episode unlocked collect_wood + collect_sapling (2 unique), reward 3
        E4.0  unlocked collect_wood and collect_sapling, reward 2, error "HTTP 429"
    """
    p = RolloutBatch.objects.create(name="P", policy="openai", model="m-a")
    q = RolloutBatch.objects.create(name="Q", policy="scripted")
    r = RolloutBatch.objects.create(name="R", policy="openai", model="m-b")
    episodes = {
        "E1": Episode.objects.create(
            batch=p, seed=1, status="finished", total_reward=2, achievement_count=2,
            achievements={"collect_wood": 1, "place_table": 3},
        ),
        "E2": Episode.objects.create(
            batch=p, seed=2, status="finished", total_reward=1, achievement_count=1,
            achievements={"collect_wood": 0},
        ),
        "E3": Episode.objects.create(
            batch=q, seed=1, status="finished", fork_prefix_turns=2, achievements={}
        ),
        "E4": Episode.objects.create(
            batch=r, seed=7, status="finished", total_reward=3, achievement_count=2,
            achievements={"collect_wood": 5, "collect_sapling": 2},
        ),
    }  # fmt: skip
    turns = {
        "E1.0": {"observation_text": "grass all around"},
        "E1.1": {"achievements_unlocked": ["collect_wood"], "reward": 1,
                 "model_text": "Chop the TREE"},
        "E1.2": {"error": "timeout", "error_kind": "timeout", "flagged": True},
        "E1.3": {"achievements_unlocked": ["place_table"], "reward": 1, "note": "nice table"},
        "E2.0": {"achievements_unlocked": ["collect_wood"], "reward": 1, "text_fallback": True},
        "E2.1": {"error_kind": "bad_json", "reward": -0.1},
        "E2.2": {"flagged": True, "model_text": None},
        "E3.0": {"observation_text": "a tree here"},
        "E3.1": {},
        "E3.2": {"flagged": True, "text_fallback": True},
        "E4.0": {"achievements_unlocked": ["collect_wood", "collect_sapling"], "reward": 2,
                 "error": "HTTP 429", "error_kind": "http_429"},
    }  # fmt: skip
    ids: dict[int, str] = {}
    for label, fields in turns.items():
        episode_label, index = label.split(".")
        episode = episodes[episode_label]
        frame = Frame.objects.create(
            episode=episode, step=int(index), sha256="0" * 64, image="f.png", width=8, height=8
        )
        fields = {"model_text": "I walk", **fields}
        turn = Turn.objects.create(episode=episode, index=int(index), frame=frame, **fields)
        ids[turn.id] = label
    relabeled = next(t for t, label in ids.items() if label == "E3.2")
    TurnRelabel.objects.create(
        turn_id=relabeled, actions=["noop"], labeled_by=editor, labeled_at=timezone.now()
    )
    return {"labels": ids, "batches": {"P": p.id, "Q": q.id, "R": r.id}}


def _picked(world, selection: TurnSelection) -> set[str]:
    labels = world["labels"]
    return {labels[i] for i in turns_selected(selection).values_list("id", flat=True)}


def _listed(world, **changes) -> set[str]:
    """What the turn list selects: every turn, narrowed; its pages' query shape picks the
    same turns as the semi-join."""
    selection = replace(EVERY_TURN, **changes)
    labels = world["labels"]
    paged = turns_selected(selection, for_pages=True).values_list("id", flat=True)
    assert {labels[i] for i in paged} == _picked(world, selection)
    return _picked(world, selection)


def test_it_starts_the_turn_list_from_every_turn_and_a_dataset_without_prose_or_replays(world):
    assert _listed(world) == ALL
    # A dataset leaves out E2.0 (prose, not corrected) and the fork's replayed E3.0, E3.1.
    assert _picked(world, TurnSelection()) == ALL - {"E2.0", "E3.0", "E3.1"}
    assert _picked(world, TurnSelection(include_fork_prefix=True)) == ALL - {"E2.0"}
    assert _picked(world, TurnSelection(include_text_fallback=True)) == ALL - {"E3.0", "E3.1"}


def test_it_tells_the_turns_achievements_from_its_episodes(world):
    # Per turn: the turn itself unlocked it.
    assert _listed(world, turn_unlocked=("collect_wood",)) == {"E1.1", "E2.0", "E4.0"}
    assert _listed(world, turn_unlocked=("place_table",)) == {"E1.3"}
    assert _listed(world, turn_unlocked=("collect_wood", "collect_sapling")) == {"E4.0"}
    assert _listed(world, turn_unlocked=("collect_diamond",)) == set()
    # Per episode: every turn of an episode that unlocked it.
    wood_episodes = {"E1.0", "E1.1", "E1.2", "E1.3", "E2.0", "E2.1", "E2.2", "E4.0"}
    assert _listed(world, require_achievements=("collect_wood",)) == wood_episodes
    assert _picked(world, TurnSelection(require_achievements=("collect_wood",))) == (
        wood_episodes - {"E2.0"}
    )
    assert _picked(world, TurnSelection(exclude_achievements=("place_table",))) == {
        "E2.1", "E2.2", "E3.2", "E4.0",
    }  # fmt: skip
    assert _picked(world, TurnSelection(min_unique=2)) == {"E1.0", "E1.1", "E1.2", "E1.3", "E4.0"}
    assert _picked(world, TurnSelection(min_reward=2.5)) == {"E4.0"}
    with pytest.raises(FilterError, match="unlocked: unknown achievement 'collect_unicorns'"):
        replace(EVERY_TURN, turn_unlocked=("collect_unicorns",))


def test_it_keeps_the_flagged_choices(world):
    assert _listed(world, flagged="only") == {"E1.2", "E2.2", "E3.2"}
    assert _listed(world, flagged="exclude") == ALL - {"E1.2", "E2.2", "E3.2"}
    assert _picked(world, TurnSelection(flagged="only")) == {"E1.2", "E2.2", "E3.2"}
    with pytest.raises(FilterError, match="flagged: 'yes' is not one of any, only, exclude"):
        TurnSelection(flagged="yes")


def test_it_keeps_the_two_meanings_of_errors(world):
    # The turn list's: an error message (E2.1 has a kind but no message).
    assert _listed(world, has_error="yes") == {"E1.2", "E4.0"}
    assert _listed(world, has_error="no") == ALL - {"E1.2", "E4.0"}
    # A dataset's: neither a message nor a kind.
    assert _picked(world, TurnSelection(exclude_errors=True)) == {
        "E1.0", "E1.1", "E1.3", "E2.2", "E3.2",
    }  # fmt: skip


def test_it_filters_by_batch_model_policy_seed_and_reward(world):
    batches = world["batches"]
    assert _listed(world, batches=(batches["Q"],)) == {"E3.0", "E3.1", "E3.2"}
    assert _listed(world, batches=(batches["P"], batches["R"])) == ALL - {"E3.0", "E3.1", "E3.2"}
    p_turns = {"E1.0", "E1.1", "E1.2", "E1.3", "E2.0", "E2.1", "E2.2"}
    assert _listed(world, models=("m-a",)) == p_turns
    assert _listed(world, models=("m-b",)) == {"E4.0"}
    assert _listed(world, policies=("scripted",)) == {"E3.0", "E3.1", "E3.2"}
    assert _listed(world, seeds=(1,)) == {"E1.0", "E1.1", "E1.2", "E1.3", "E3.0", "E3.1", "E3.2"}
    assert _listed(world, reward="positive") == {"E1.1", "E1.3", "E2.0", "E4.0"}
    assert _listed(world, reward="negative") == {"E2.1"}
    assert _listed(world, reward="zero") == {"E1.0", "E1.2", "E2.2", "E3.0", "E3.1", "E3.2"}


def test_it_searches_model_text_notes_and_observations_ignoring_case(world):
    assert _listed(world, search="tree") == {"E1.1", "E3.0"}
    assert _listed(world, search="NICE") == {"E1.3"}
    assert _listed(world, search="grass all") == {"E1.0"}
    assert _listed(world, search="unicorn") == set()


def test_it_combines_filters_and_human_in_the_loop_options(world):
    combined = _listed(
        world, models=("m-a",), flagged="exclude", has_error="no", turn_unlocked=("collect_wood",)
    )
    assert combined == {"E1.1", "E2.0"}
    assert _picked(world, TurnSelection(relabeled="only")) == {"E3.2"}
    assert _picked(world, TurnSelection(relabeled="exclude", include_fork_prefix=True)) == (
        ALL - {"E2.0", "E3.2"}
    )


def test_a_dataset_filter_stored_before_the_merge_selects_the_same_turns(world):
    stored = {
        "batches": [world["batches"]["P"]],
        "models": [],
        "policies": [],
        "require_achievements": ["collect_wood"],
        "exclude_achievements": [],
        "min_unique": None,
        "min_reward": None,
        "user_image": False,
        "include_assistant": False,
        "flagged": "exclude",
        "exclude_errors": True,
        "include_text_fallback": False,
        "relabeled": "any",
        "include_fork_prefix": False,
        "top_per_seed": None,
        "at_or_above_mean": False,
    }
    assert _picked(world, TurnSelection.from_json(stored)) == {"E1.0", "E1.1", "E1.3"}
    # An older one, saved before most options existed: missing keys are the defaults.
    assert _picked(world, TurnSelection.from_json({"models": ["m-b"]})) == {"E4.0"}


def test_a_bulk_flag_stored_before_the_merge_is_rewritten_to_the_same_turns(world, editor):
    old = {
        "batch_id": None,
        "model": "m-a",
        "flagged": "exclude",
        "has_error": "no",
        "achievement": "collect_wood",
        "policy": "",
        "seed": None,
        "reward": "any",
        "search": "",
    }
    new = _bulk_flag_migration.turn_filters_to_selection(old)
    assert _picked(world, TurnSelection.from_json(new)) == {"E1.1", "E2.0"}
    everything = _bulk_flag_migration.turn_filters_to_selection(
        {**old, "model": "", "flagged": "any", "has_error": "any", "achievement": ""}
    )
    assert _picked(world, TurnSelection.from_json(everything)) == ALL
    # Written back, the job links to the turn list with the same address query.
    job = TurnBulkFlag.objects.create(filters=new, flagged=True, created_by=editor)
    query = parse_qs(turn_list_query(TurnSelection.from_json(job.filters)))
    assert query == {
        "model": ["m-a"],
        "flagged": ["exclude"],
        "has_error": ["no"],
        "achievement": ["collect_wood"],
    }


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", ALL),
        ("?achievement=collect_wood", {"E1.1", "E2.0", "E4.0"}),
        ("?flagged=only", {"E1.2", "E2.2", "E3.2"}),
        ("?has_error=yes", {"E1.2", "E4.0"}),
        ("?model=m-b", {"E4.0"}),
        ("?q=Tree", {"E1.1", "E3.0"}),
        ("?seed=7&reward=positive", {"E4.0"}),
        (
            "?model=m-a&flagged=exclude&has_error=no&achievement=collect_wood",
            {"E1.1", "E2.0"},
        ),
    ],
)
def test_the_turn_list_addresses_show_the_same_turns(world, viewer_client, query, expected):
    response = viewer_client.get(f"/turns/{query}")
    assert response.status_code == 200
    labels = world["labels"]
    assert {labels[turn.id] for turn in response.context["page"]} == expected
