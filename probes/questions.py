"""Perception questions on one recorded frame, each with the one right answer the game's own
state gives. Pure: no Django, no database.

The inputs are what the studio stores for every frame: its state (`StudioEnv.state()`:
vitals, inventory, facing, daylight, sleeping) and the text observation of the turn that
showed it, whose local view names what is on each of the 9 x 7 cells the frame draws above
its inventory bar (`StudioEnv.local_map()`: a creature on a cell is named instead of the
ground under it; "void" is outside the world).

Every question is multiple choice; its choices are shuffled by a generator keyed on the
set's seed and the question's frame, kind and subject, so a question's choices do not
depend on which other frames are in its set.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from crafter import constants

from rollouts.game.crafter_env import LOCAL_VIEW_GRID, VITALS

MATERIALS: tuple[str, ...] = tuple(constants.materials)
# crafter's creatures and other objects a world holds (crafter.objects: Cow, Zombie,
# Skeleton, Arrow, Plant), named as the local view names them: the class name, lower case.
# Fence is never placed by the game.
CREATURES: tuple[str, ...] = ("cow", "zombie", "skeleton", "arrow", "plant")
FACING_NAMES: tuple[str, ...] = MATERIALS + CREATURES
COUNT_SUBJECTS: tuple[str, ...] = (
    "cow",
    "zombie",
    "skeleton",
    "tree",
    "water",
    "stone",
    "coal",
    "iron",
    "diamond",
    "lava",
)
COUNT_ANSWERS: tuple[str, ...] = ("0", "1", "2", "3+")
THREATS: tuple[str, ...] = ("zombie", "skeleton")
# crafter measures a creature's reach with `Object.distance`, the L1 norm (a zombie hits at
# 1); "within 2 cells" is the same walking distance.
THREAT_DISTANCE = 2
DIRECTION_SUBJECTS: tuple[str, ...] = ("tree", "water", "stone")
NONE_IN_VIEW = "none in view"
DIRECTIONS: tuple[str, ...] = ("up", "down", "left", "right", NONE_IN_VIEW)
ITEMS: tuple[str, ...] = tuple(name for name in constants.items if name not in VITALS)
# crafter clamps every inventory value, vitals included, to [0, its max] after each step;
# every max is 9 (data.yaml), and `ItemView._amount` draws the digits 1-9 (0: not drawn).
DIGITS: tuple[str, ...] = tuple(str(n) for n in range(10))
YES_NO: tuple[str, ...] = ("yes", "no")
# `LocalView._light`: below this daylight crafter adds the night's noise to the view (and
# darkens it more the lower it goes); at or above it the view has no noise.
NIGHT_BELOW = 0.5
# Multiple choice with more possible answers than this (facing, vital, inventory): the
# right one and this many minus one others.
CHOICES_SHOWN = 4

VIEW_COLUMNS, VIEW_ROWS = LOCAL_VIEW_GRID
CENTER = (VIEW_COLUMNS // 2, VIEW_ROWS // 2)  # the player's cell (column, row)
_FACING_OFFSETS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
_VIEW_NAMES = frozenset(FACING_NAMES) | {"you", "void"}
_LOCAL_VIEW_HEADER = "Local view ("


class QuestionError(ValueError):
    """Bad input to question generation (an unknown kind); one line."""


@dataclass(frozen=True, slots=True)
class Question:
    kind: str
    subject: str
    text: str
    choices: tuple[str, ...]
    answer: str


def kinds_checked(kinds: Iterable[str] | None) -> tuple[str, ...]:
    """The kinds asked for, in the order given, without repeats; all of them for None."""
    known = kind_names()
    if kinds is None:
        return known
    chosen = tuple(dict.fromkeys(kinds))
    unknown = [k for k in chosen if k not in known]
    if unknown:
        raise QuestionError(f"kinds: unknown kind {unknown[0]!r}; valid: {', '.join(known)}")
    if not chosen:
        raise QuestionError(f"kinds: name at least one of {', '.join(known)}")
    return chosen


def local_view(observation_text: str) -> list[list[str]] | None:
    """The 9 x 7 names of the text observation's local view, rows top to bottom; None when
    the text holds no such view (an imported row, a view that is not the game's)."""
    lines = observation_text.splitlines()
    for at, line in enumerate(lines):
        if line.startswith(_LOCAL_VIEW_HEADER):
            rows = [row.split() for row in lines[at + 1 : at + 1 + VIEW_ROWS]]
            break
    else:
        return None
    if len(rows) != VIEW_ROWS or any(len(row) != VIEW_COLUMNS for row in rows):
        return None
    if any(name not in _VIEW_NAMES for row in rows for name in row):
        return None
    if rows[CENTER[1]][CENTER[0]] != "you":
        return None
    return rows


def state_usable(state: Mapping[str, Any]) -> bool:
    """The frame's state has what the questions read (an imported frame may have none)."""
    try:
        vitals, inventory = state["vitals"], state["inventory"]
        return (
            all(isinstance(vitals[v], int) for v in VITALS)
            and isinstance(inventory, dict)
            and all(isinstance(n, int) for n in inventory.values())
            and state["facing"] in _FACING_OFFSETS
            and isinstance(state["daylight"], int | float)
            and isinstance(state["sleeping"], bool)
        )
    except (KeyError, TypeError):
        return False


# -- the right answers ------------------------------------------------------------------------


def facing_answer(view: Sequence[Sequence[str]], state: Mapping[str, Any]) -> str | None:
    """What is on the cell the player faces: a creature there, else the ground; None
    outside the world."""
    dx, dy = _FACING_OFFSETS[state["facing"]]
    name = view[CENTER[1] + dy][CENTER[0] + dx]
    return None if name == "void" else name


def count_answer(view: Sequence[Sequence[str]], subject: str) -> str:
    n = sum(row.count(subject) for row in view)
    return COUNT_ANSWERS[min(n, len(COUNT_ANSWERS) - 1)]


def threat_near_answer(view: Sequence[Sequence[str]]) -> str:
    cx, cy = CENTER
    near = any(
        name in THREATS and abs(x - cx) + abs(y - cy) <= THREAT_DISTANCE
        for y, row in enumerate(view)
        for x, name in enumerate(row)
    )
    return "yes" if near else "no"


def nearest_direction_answer(view: Sequence[Sequence[str]], subject: str) -> str | None:
    """Where the nearest cell of `subject` is (walking distance, L1); None when that has no
    single answer: nearest cells in different directions, or one on a diagonal."""
    cx, cy = CENTER
    cells = [
        (x - cx, y - cy)
        for y, row in enumerate(view)
        for x, name in enumerate(row)
        if name == subject
    ]
    if not cells:
        return NONE_IN_VIEW
    nearest = min(abs(dx) + abs(dy) for dx, dy in cells)
    directions = {_direction(dx, dy) for dx, dy in cells if abs(dx) + abs(dy) == nearest}
    if len(directions) != 1 or None in directions:
        return None
    return directions.pop()


def _direction(dx: int, dy: int) -> str | None:
    if abs(dx) > abs(dy):
        return "right" if dx > 0 else "left"
    if abs(dy) > abs(dx):
        return "down" if dy > 0 else "up"
    return None


def drawn_value(value: int) -> str:
    """An inventory or vital value as the inventory bar shows it (crafter clamps to 0-9)."""
    return str(max(0, min(int(value), 9)))


def night_answer(state: Mapping[str, Any]) -> str:
    return "yes" if float(state["daylight"]) < NIGHT_BELOW else "no"


def asleep_answer(state: Mapping[str, Any]) -> str:
    return "yes" if state["sleeping"] else "no"


# -- questions ----------------------------------------------------------------------------------


# What a kind asks of one frame: (subject, question, the one right answer or None when the
# frame has none), one per question, in subject order.
Asked = Iterable[tuple[str, str, str | None]]


@dataclass(frozen=True)
class ProbeKind:
    """A kind of question: its name (stored with every question) and what it asks."""

    name: str
    ask: Callable[[Sequence[Sequence[str]], Mapping[str, Any]], Asked]
    # Every answer it may have, in the order charts and balancing list them; the choices
    # shown are drawn from these.
    answers: tuple[str, ...]
    # The first distractors are what the view shows (it asks which cell, not what is there).
    seen_first: bool = False


_PROBE_KINDS: dict[str, ProbeKind] = {}


def probe_kind_register(kind: ProbeKind) -> ProbeKind:
    """Add a kind; the order of registration is the order a set asks them of a frame."""
    if kind.name in _PROBE_KINDS:
        raise ValueError(f"probe kind {kind.name!r} is registered twice")
    _PROBE_KINDS[kind.name] = kind
    return kind


def probe_kind_unregister(name: str) -> None:
    """Remove a kind (tests that register a throwaway one)."""
    _PROBE_KINDS.pop(name, None)


def kind_names() -> tuple[str, ...]:
    """The kinds, in the order a set asks them of each frame (the names stored)."""
    return tuple(_PROBE_KINDS)


def __getattr__(name: str) -> tuple[str, ...]:
    # `KINDS` reads the registry when asked, so a kind registered later is in it.
    if name == "KINDS":
        return kind_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def frame_questions(
    *,
    state: Mapping[str, Any],
    view: Sequence[Sequence[str]],
    kinds: Sequence[str],
    seed: int,
    frame_key: int | str,
) -> list[Question]:
    """The questions of `kinds` on one frame, in kind then subject order. A question with no
    single right answer (facing outside the world, a nearest cell on a diagonal) is left out.
    `frame_key` (the frame's id) keys the choices' shuffle with `seed`."""
    questions: list[Question] = []
    for name in kinds:
        kind = _PROBE_KINDS.get(name)
        if kind is None:
            valid = ", ".join(kind_names())
            raise QuestionError(f"kinds: unknown kind {name!r}; valid: {valid}")
        preferred = _seen(view) if kind.seen_first else ()
        for subject, text, answer in kind.ask(view, state):
            if answer is None:
                continue
            rng = _rng(seed, frame_key, name, subject)
            choices = _choices(answer, kind.answers, rng, preferred=preferred)
            questions.append(Question(name, subject, text, choices, answer))
    return questions


# -- the kinds, in the order a set asks them ----------------------------------------------


def _ask_facing(view: Sequence[Sequence[str]], state: Mapping[str, Any]) -> Asked:
    text = "What is on the cell the player is facing?"
    yield "", text, facing_answer(view, state)


def _ask_count(view: Sequence[Sequence[str]], state: Mapping[str, Any]) -> Asked:
    for subject in COUNT_SUBJECTS:
        what = f"{subject}s" if subject in CREATURES else f"{subject} cells"
        text = f"How many {what} are in view?"
        yield subject, text, count_answer(view, subject)


def _ask_threat_near(view: Sequence[Sequence[str]], state: Mapping[str, Any]) -> Asked:
    text = "Is a zombie or a skeleton within 2 cells of the player (walking distance)?"
    yield "", text, threat_near_answer(view)


def _ask_nearest_direction(view: Sequence[Sequence[str]], state: Mapping[str, Any]) -> Asked:
    for subject in DIRECTION_SUBJECTS:
        text = f"In which direction from the player is the nearest {subject}?"
        yield subject, text, nearest_direction_answer(view, subject)


def _ask_vital(view: Sequence[Sequence[str]], state: Mapping[str, Any]) -> Asked:
    for subject in VITALS:
        text = f"What is the player's {subject}, as the inventory bar shows it (0-9)?"
        yield subject, text, drawn_value(state["vitals"][subject])


def _ask_inventory(view: Sequence[Sequence[str]], state: Mapping[str, Any]) -> Asked:
    inventory = state["inventory"]
    for subject in ITEMS:
        text = f"How many {subject.replace('_', ' ')} does the player carry?"
        yield subject, text, drawn_value(inventory.get(subject, 0))


def _ask_night(view: Sequence[Sequence[str]], state: Mapping[str, Any]) -> Asked:
    yield "", "Is it night?", night_answer(state)


def _ask_asleep(view: Sequence[Sequence[str]], state: Mapping[str, Any]) -> Asked:
    yield "", "Is the player asleep?", asleep_answer(state)


for _kind in (
    ProbeKind("facing", _ask_facing, FACING_NAMES, seen_first=True),
    ProbeKind("count", _ask_count, COUNT_ANSWERS),
    ProbeKind("threat_near", _ask_threat_near, YES_NO),
    ProbeKind("nearest_direction", _ask_nearest_direction, DIRECTIONS),
    ProbeKind("vital", _ask_vital, DIGITS),
    ProbeKind("inventory", _ask_inventory, DIGITS),
    ProbeKind("night", _ask_night, YES_NO),
    ProbeKind("asleep", _ask_asleep, YES_NO),
):
    probe_kind_register(_kind)


def _seen(view: Sequence[Sequence[str]]) -> tuple[str, ...]:
    """What the view shows, in reading order: a facing question's first distractors, so that
    it asks which cell, not only what is on screen."""
    return tuple(dict.fromkeys(n for row in view for n in row if n in FACING_NAMES))


def _choices(
    answer: str, pool: Sequence[str], rng: random.Random, *, preferred: Sequence[str] = ()
) -> tuple[str, ...]:
    """The right answer and others from `pool` (all of it when small), shuffled."""
    if len(pool) <= CHOICES_SHOWN + 1:
        choices = list(pool)
    else:
        others = [p for p in preferred if p != answer and p in pool]
        rng.shuffle(others)
        rest = [p for p in pool if p != answer and p not in others]
        rng.shuffle(rest)
        choices = [answer, *(others + rest)[: CHOICES_SHOWN - 1]]
    rng.shuffle(choices)
    return tuple(choices)


def _rng(seed: int, frame_key: int | str, kind: str, subject: str) -> random.Random:
    digest = hashlib.blake2b(
        f"{seed}:{frame_key}:{kind}:{subject}".encode(), digest_size=8
    ).digest()
    return random.Random(int.from_bytes(digest, "big"))


# -- balance ----------------------------------------------------------------------------------


# Each kind's possible answers in the order they are shown (numbers up, yes before no).
def answer_counts(questions: Iterable[tuple[str, str]]) -> dict[str, dict[str, int]]:
    """{kind: {answer: count}} of (kind, answer) pairs: the kinds in registration order,
    each kind's answers in its `answers` order, only those that occur."""
    counts: dict[tuple[str, str], int] = {}
    for key in questions:
        counts[key] = counts.get(key, 0) + 1
    result: dict[str, dict[str, int]] = {}
    for kind in _PROBE_KINDS.values():
        of_kind = {a: counts[(kind.name, a)] for a in kind.answers if (kind.name, a) in counts}
        if of_kind:
            result[kind.name] = of_kind
    return result


def balanced_indices(questions: Sequence[tuple[str, str]], *, seed: int) -> list[int]:
    """Which of the (kind, answer) pairs a balanced set keeps, in their order.

    Per kind, every answer is kept at most as often as the kind's second most common answer:
    the majority answer comes down to the runner-up's count, and rarer answers are all kept.
    A yes / no kind comes out even; a kind where one answer is the only one is left out (it
    measures nothing). Which questions of an answer are kept is a sample seeded by `seed`.
    """
    by_answer: dict[tuple[str, str], list[int]] = {}
    for i, key in enumerate(questions):
        by_answer.setdefault(key, []).append(i)
    sizes: dict[str, list[int]] = {}
    for (kind, _), indices in by_answer.items():
        sizes.setdefault(kind, []).append(len(indices))
    caps: dict[str, int] = {}
    for kind, counts in sizes.items():
        ranked = sorted(counts, reverse=True)
        caps[kind] = ranked[1] if len(ranked) > 1 else 0
    kept: list[int] = []
    for (kind, answer), indices in by_answer.items():
        cap = caps[kind]
        if len(indices) <= cap:
            kept.extend(indices)
        else:
            rng = random.Random(f"{seed}:balance:{kind}:{answer}")
            kept.extend(rng.sample(indices, cap))
    kept.sort()
    return kept
