"""Questions and their right answers on one frame: hand-worked views, no database."""

from __future__ import annotations

import pytest

from probes import questions as q
from rollouts.game.crafter_env import ACTION_INDEX, StudioEnv, text_observation

# A 9 x 7 view worked by hand; the player ("you") is at column 4, row 3.
VIEW_ROWS = [
    "grass grass tree  tree  grass water water sand  sand",
    "grass cow   grass grass grass water water sand  stone",
    "grass grass grass tree  table grass sand  sand  stone",
    "grass grass zombie grass you grass grass sand  coal",
    "grass grass grass grass grass grass grass path  iron",
    "tree  grass grass grass grass grass skeleton path path",
    "void  void  void  void  void  void  void  void  void",
]
STATE = {
    "step": 12,
    "vitals": {"health": 9, "food": 3, "drink": 0, "energy": 7},
    "inventory": {"wood": 2, "sapling": 1},
    "position": [32, 61],
    "facing": "up",
    "sleeping": False,
    "daylight": 0.3,
    "achievements": [],
}


def observation(rows: list[str]) -> str:
    grid = "\n".join(" ".join(f"{cell:>8}" for cell in row.split()) for row in rows)
    return (
        "Step 12 of 256.\nHealth 9/9, food 3/9, drink 0/9, energy 7/9.\n"
        "Position (32, 61), facing up.\nInventory: wood=2, sapling=1.\n"
        "Achievements unlocked: none.\n"
        f"Local view (9 columns x 7 rows, you are in the centre):\n{grid}"
    )


@pytest.fixture
def view() -> list[list[str]]:
    parsed = q.local_view(observation(VIEW_ROWS))
    assert parsed is not None
    return parsed


def answers(view, state=STATE, kinds=q.KINDS, seed=0) -> dict[tuple[str, str], str]:
    found = q.frame_questions(state=state, view=view, kinds=kinds, seed=seed, frame_key=1)
    return {(x.kind, x.subject): x.answer for x in found}


def test_it_reads_the_local_view_of_a_text_observation(view):
    assert view[3][4] == "you"
    assert view[1][1] == "cow"
    assert view[6] == ["void"] * 9


@pytest.mark.parametrize(
    "text",
    [
        "Step 1 of 5.\nno map here",
        observation(VIEW_ROWS[:6]),  # a row short
        observation([r.replace("cow", "unicorn") for r in VIEW_ROWS]),  # not a crafter name
        observation([r.replace("you", "grass") for r in VIEW_ROWS]),  # no player in the centre
    ],
)
def test_it_refuses_a_view_that_is_not_the_games(text):
    assert q.local_view(text) is None


def test_it_reads_the_view_of_the_studios_own_text_observation():
    env = StudioEnv(seed=4)
    env.reset()
    for _ in range(5):
        env.step(ACTION_INDEX["move_left"])
    assert q.local_view(text_observation(env)) == env.local_map()


def test_its_answers_are_those_worked_out_by_hand(view):
    got = answers(view)
    assert got[("facing", "")] == "table"
    assert got[("count", "cow")] == "1"
    assert got[("count", "zombie")] == "1"
    assert got[("count", "skeleton")] == "1"
    assert got[("count", "tree")] == "3+"  # four trees
    assert got[("count", "water")] == "3+"
    assert got[("count", "stone")] == "2"
    assert got[("count", "coal")] == "1"
    assert got[("count", "iron")] == "1"
    assert got[("count", "diamond")] == "0"
    assert got[("count", "lava")] == "0"
    # The zombie is two cells left: yes. The skeleton is 2 right and 2 down: 4 away.
    assert got[("threat_near", "")] == "yes"
    # The nearest tree is one left and one up, on a diagonal: no single direction, no question.
    assert ("nearest_direction", "tree") not in got
    assert got[("nearest_direction", "water")] == "up"  # 1 right, 2 up
    assert got[("nearest_direction", "stone")] == "right"  # 4 right, 1 up
    assert got[("vital", "health")] == "9"
    assert got[("vital", "food")] == "3"
    assert got[("vital", "drink")] == "0"
    assert got[("vital", "energy")] == "7"
    assert got[("inventory", "wood")] == "2"
    assert got[("inventory", "sapling")] == "1"
    assert got[("inventory", "iron_pickaxe")] == "0"
    assert got[("night", "")] == "yes"  # daylight 0.3
    assert got[("asleep", "")] == "no"
    assert len(got) == 1 + 10 + 1 + 2 + 4 + 12 + 1 + 1


def test_it_measures_the_threat_by_walking_distance(view):
    rows = [r.replace("zombie", "grass") for r in VIEW_ROWS]
    rows[2] = "grass grass zombie tree  table grass sand  sand  stone"  # 2 left, 1 up: 3 steps
    far = q.local_view(observation(rows))
    assert answers(far, kinds=["threat_near"]) == {("threat_near", ""): "no"}
    rows[2] = "grass grass grass tree  table grass sand  sand  stone"
    rows[4] = "grass grass grass grass grass skeleton grass path iron"  # 1 right, 1 down: 2
    near = q.local_view(observation(rows))
    assert answers(near, kinds=["threat_near"]) == {("threat_near", ""): "yes"}


@pytest.mark.parametrize(
    ("facing", "expected"),
    [("up", "table"), ("left", "grass"), ("right", "grass"), ("down", "grass")],
)
def test_it_reads_the_cell_the_player_faces(view, facing, expected):
    got = answers(view, state={**STATE, "facing": facing}, kinds=["facing"])
    assert got == {("facing", ""): expected}


def test_it_asks_nothing_about_a_cell_outside_the_world():
    rows = list(VIEW_ROWS)
    rows[2] = "void void void void void void void void void"
    edge = q.local_view(observation(rows))
    assert answers(edge, kinds=["facing"]) == {}


def test_night_is_crafters_noise_threshold(view):
    assert answers(view, state={**STATE, "daylight": 0.4999}, kinds=["night"])[("night", "")] == (
        "yes"
    )
    assert answers(view, state={**STATE, "daylight": 0.5}, kinds=["night"])[("night", "")] == "no"
    sleeping = {**STATE, "sleeping": True}
    assert answers(view, state=sleeping, kinds=["asleep"]) == {("asleep", ""): "yes"}


def test_the_right_answer_is_always_one_of_its_shuffled_choices(view):
    found = q.frame_questions(state=STATE, view=view, kinds=q.KINDS, seed=9, frame_key=77)
    for question in found:
        assert question.answer in question.choices
        assert len(set(question.choices)) == len(question.choices)
    by_kind = {x.kind: x for x in found}
    assert len(by_kind["facing"].choices) == 4
    assert len(by_kind["vital"].choices) == 4
    assert sorted(by_kind["count"].choices) == ["0", "1", "2", "3+"]
    assert sorted(by_kind["night"].choices) == ["no", "yes"]
    assert sorted(by_kind["nearest_direction"].choices) == sorted(
        ["up", "down", "left", "right", "none in view"]
    )
    # A facing question's other choices are things the view shows: which cell, not what.
    assert set(by_kind["facing"].choices) <= {"table", *{n for r in VIEW_ROWS for n in r.split()}}


def test_the_same_seed_gives_the_same_choices_and_another_seed_others(view):
    def run(seed: int, key: int) -> list[tuple[str, ...]]:
        found = q.frame_questions(state=STATE, view=view, kinds=q.KINDS, seed=seed, frame_key=key)
        return [x.choices for x in found]

    assert run(1, 5) == run(1, 5)
    assert run(1, 5) != run(2, 5)
    assert run(1, 5) != run(1, 6)


def test_it_refuses_an_unknown_kind():
    with pytest.raises(q.QuestionError, match="unknown kind 'colour'"):
        q.kinds_checked(["night", "colour"])
    assert q.kinds_checked(["night", "night", "facing"]) == ("night", "facing")
    assert q.kinds_checked(None) == q.KINDS


def test_balance_cuts_each_answer_down_to_the_runner_up():
    pairs = (
        [("night", "no")] * 8
        + [("night", "yes")] * 2
        + [("count", "0")] * 6
        + [("count", "1")] * 3
        + [("count", "2")] * 1
        + [("asleep", "no")] * 4
    )
    kept = q.balanced_indices(pairs, seed=3)
    counts = q.answer_counts(pairs[i] for i in kept)
    # night: no 8 -> 2 (yes's count); count: 0 6 -> 3 (1's count), 2 stays 1; asleep: one
    # answer only, left out.
    assert counts == {"count": {"0": 3, "1": 3, "2": 1}, "night": {"yes": 2, "no": 2}}
    assert kept == sorted(kept)
    assert q.balanced_indices(pairs, seed=3) == kept
    assert q.balanced_indices(pairs, seed=4) != kept
