"""The stored right answers against crafter itself, not against the code that wrote them.

Long recorded games are replayed, action by action, in stock crafter (`crafter.Env`, its
world, player and objects); at every recorded frame the facing cell, the creatures and
materials in view, the threats, the inventory, the vitals, daylight and sleep are read
from crafter's own objects through its own API (`world[pos]`, `world.objects`,
`Object.distance`, `player.inventory`), and every stored question of that frame must have
the answer crafter gives, and every question crafter says has one answer must be there.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import crafter
import numpy as np
import pytest
from crafter import objects

from probes.models import ProbeQuestion
from probes.services import probe_set_create
from rollouts.models import Turn
from rollouts.review.turn_selection import TurnSelection
from rollouts.tests.helpers import record_batch

pytestmark = pytest.mark.django_db

SEEDS = (3, 7, 8)  # games of 300, 234 and 239 steps (the player dies in the last two)
STEPS = 300
# Digging, sleeping, placing and crafting as well as walking: inventories, sleep and
# creatures nearby change over a game.
SCRIPT = (
    "move_left",
    "do",
    "do",
    "move_up",
    "do",
    "place_table",
    "make_wood_pickaxe",
    "move_right",
    "do",
    "sleep",
    "sleep",
    "sleep",
    "move_down",
    "do",
    "place_stone",
    "move_down",
    "noop",
)
HALF_VIEW = (4, 3)  # the 9 x 7 cells crafter's local view draws: 4 either side, 3 above/below


class _StockReplay(crafter.Env):
    """Stock crafter 1.8.3, made to replay a recording (two changes, nothing else).

    - `render` draws nothing: crafter draws the night's noise from the *world's* random
      state, so drawing would change the world (the studio draws it from its own).
    - `_balance_object` is crafter's, given the chunk's creatures ordered by position:
      crafter picks the one to despawn from a `set`, whose order is memory addresses.
    """

    def render(self, size=None):
        return np.zeros((1, 1, 3), np.uint8)

    def _balance_object(self, chunk, objs, *args, **kwargs):
        ordered = sorted(objs, key=lambda o: (int(o.pos[0]), int(o.pos[1])))
        return super()._balance_object(chunk, ordered, *args, **kwargs)


def _name(material, obj) -> str | None:
    if obj is not None:
        return type(obj).__name__.lower()
    return material


def _crafter_answers(env: crafter.Env) -> dict[tuple[str, str], str]:
    """{(kind, subject): answer} read from crafter's objects; a key is missing where
    there is no single answer."""
    world, player = env._world, env._player
    px, py = int(player.pos[0]), int(player.pos[1])
    hx, hy = HALF_VIEW
    cells = {}
    for dx in range(-hx, hx + 1):
        for dy in range(-hy, hy + 1):
            material, obj = world[(px + dx, py + dy)]
            cells[(dx, dy)] = _name(material, obj)
    in_view = [
        o
        for o in world.objects
        if o is not player and abs(o.pos[0] - px) <= hx and abs(o.pos[1] - py) <= hy
    ]
    answers: dict[tuple[str, str], str] = {}
    facing = _name(*world[player.pos + np.array(player.facing)])
    if facing is not None:
        answers[("facing", "")] = facing
    creatures = Counter(type(o).__name__.lower() for o in in_view)
    for subject in ("cow", "zombie", "skeleton"):
        answers[("count", subject)] = _bucket(creatures[subject])
    for subject in ("tree", "water", "stone", "coal", "iron", "diamond", "lava"):
        answers[("count", subject)] = _bucket(sum(n == subject for n in cells.values()))
    threat = any(
        isinstance(o, objects.Zombie | objects.Skeleton) and player.distance(o) <= 2
        for o in world.objects
    )
    answers[("threat_near", "")] = "yes" if threat else "no"
    for subject in ("tree", "water", "stone"):
        where = [(dx, dy) for (dx, dy), n in cells.items() if n == subject]
        if not where:
            answers[("nearest_direction", subject)] = "none in view"
            continue
        nearest = min(player.distance(player.pos + np.array(d)) for d in where)
        ways = {_way(dx, dy) for dx, dy in where if abs(dx) + abs(dy) == nearest}
        if len(ways) == 1 and None not in ways:
            answers[("nearest_direction", subject)] = ways.pop()
    for vital in ("health", "food", "drink", "energy"):
        answers[("vital", vital)] = str(player.inventory[vital])
    for item, amount in player.inventory.items():
        if item not in ("health", "food", "drink", "energy"):
            answers[("inventory", item)] = str(amount)
    answers[("night", "")] = "yes" if world.daylight < 0.5 else "no"
    answers[("asleep", "")] = "yes" if player.sleeping else "no"
    return answers


def _bucket(n: int) -> str:
    return "3+" if n >= 3 else str(n)


def _way(dx: int, dy: int) -> str | None:
    if abs(dx) > abs(dy):
        return "right" if dx > 0 else "left"
    if abs(dy) > abs(dx):
        return "down" if dy > 0 else "up"
    return None


def test_it_gives_the_answers_crafter_gives_over_long_games():
    batch = record_batch(policy="scripted", actions=SCRIPT, seeds=SEEDS, steps=STEPS)
    probe_set = probe_set_create(filters=TurnSelection(batches=(batch.id,)), seed=5)
    stored: dict[tuple[int, int], dict[tuple[str, str], str]] = defaultdict(dict)
    for question in ProbeQuestion.objects.filter(probe_set=probe_set).select_related(
        "frame", "episode"
    ):
        key = (question.kind, question.subject)
        assert key not in stored[(question.episode_id, question.frame.step)]
        stored[(question.episode_id, question.frame.step)][key] = question.answer
        assert question.answer in question.choices

    compared = Counter()
    seen_answers: dict[str, set[str]] = defaultdict(set)
    frames_checked = 0
    for episode in batch.episodes.order_by("seed"):
        env = _StockReplay(area=(64, 64), size=(64, 64), length=STEPS, seed=episode.seed)
        env.reset()
        turns = list(Turn.objects.filter(episode=episode).order_by("index"))
        frames = {f.step: f for f in episode.frames.all()}
        step = 0
        for turn in [None, *turns]:
            if turn is not None:
                for action in turn.actions:
                    env.step(crafter.constants.actions.index(action))
                    step += 1
            if step not in frames or (episode.id, step) not in stored:
                continue  # the last frame: no turn showed it
            # The replay is in step with the recording (a guard, not an expected value).
            assert list(env._player.pos) == frames[step].state["position"], (episode.seed, step)
            expected = _crafter_answers(env)
            got = stored[(episode.id, step)]
            assert got == expected, (episode.seed, step, _diff(got, expected))
            frames_checked += 1
            for (kind, _), answer in got.items():
                compared[kind] += 1
                seen_answers[kind].add(answer)
        assert step == episode.steps

    assert frames_checked == probe_set.frames_count
    assert sum(compared.values()) == probe_set.questions_count
    # Long games, not a trivial walk: the answers cover what the kinds can say.
    assert frames_checked >= 400
    assert {"yes", "no"} <= seen_answers["night"]
    assert {"yes", "no"} <= seen_answers["asleep"]
    assert {"yes", "no"} <= seen_answers["threat_near"]
    assert {"0", "1", "2", "3+"} <= seen_answers["count"]
    assert len(seen_answers["facing"]) >= 4
    assert len(seen_answers["nearest_direction"]) >= 4
    assert len(seen_answers["vital"]) >= 6
    assert len(seen_answers["inventory"]) >= 3


def _diff(got: dict, expected: dict) -> dict:
    keys = set(got) | set(expected)
    return {k: (got.get(k), expected.get(k)) for k in keys if got.get(k) != expected.get(k)}
