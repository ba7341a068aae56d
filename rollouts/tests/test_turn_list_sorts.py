"""The turn list in every sort order with a filter on: the same rows in the same order, page by
page, forwards and back, whichever way each order is read (see `turn_list_page`).

The turns are built by hand; every expected order below was worked out from the table in
`world`'s docstring, not by running the code.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from django.urls import reverse

from rollouts.models import Episode, Frame, RolloutBatch, Turn
from rollouts.review.selectors import TURN_SORTS, turn_list_page
from rollouts.review.turn_selection import EVERY_TURN, TurnSelection, turns_selected

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> dict[int, str]:
    """Batches P (model m-a), then Q (m-b); episodes created in this order (ids ascending):

    E1  P seed 7   E1.0 flagged   E1.1 reward 1     E1.2 error
    E2  Q seed 3   E2.0 reward -0.5   E2.1   E2.2 flagged, reward 1
    E3  P seed 3   E3.0   E3.1
    E4  Q seed 9   E4.0 error   E4.1 flagged, reward 0.5   E4.2 flagged   E4.3 reward 1
    E5  Q seed 7   E5.0 reward 1   E5.1 flagged

    Every other turn: reward 0, not flagged, no error. Returns episode id -> its name.
    """
    p = RolloutBatch.objects.create(policy="openai", model="m-a")
    q = RolloutBatch.objects.create(policy="openai", model="m-b")
    plan = (
        ("E1", p, 7, [(0, True, ""), (1, False, ""), (0, False, "timeout")]),
        ("E2", q, 3, [(-0.5, False, ""), (0, False, ""), (1, True, "")]),
        ("E3", p, 3, [(0, False, ""), (0, False, "")]),
        ("E4", q, 9, [(0, False, "bad json"), (0.5, True, ""), (0, True, ""), (1, False, "")]),
        ("E5", q, 7, [(1, False, ""), (0, True, "")]),
    )
    names = {}
    for name, batch, seed, turns in plan:
        episode = Episode.objects.create(batch=batch, seed=seed, status="finished")
        names[episode.id] = name
        for index, (reward, flagged, error) in enumerate(turns):
            frame = Frame.objects.create(
                episode=episode,
                step=index,
                sha256=f"{index:064x}",
                image="f.png",
                width=1,
                height=1,
            )
            Turn.objects.create(
                episode=episode,
                index=index,
                frame=frame,
                reward=reward,
                flagged=flagged,
                error=error,
            )
    return names


MODEL_B = replace(EVERY_TURN, models=("m-b",))  # E2, E4, E5
FLAGGED = replace(EVERY_TURN, flagged="only")  # E1.0, E2.2, E4.1, E4.2, E5.1
MODEL_B_FLAGGED = replace(MODEL_B, flagged="only")  # E2.2, E4.1, E4.2, E5.1

EXPECTED: dict[tuple[str, TurnSelection], str] = {
    ("", MODEL_B): "E5.0 E5.1 E4.0 E4.1 E4.2 E4.3 E2.0 E2.1 E2.2",
    ("episode", MODEL_B): "E2.0 E2.1 E2.2 E4.0 E4.1 E4.2 E4.3 E5.0 E5.1",
    ("-episode", MODEL_B): "E5.0 E5.1 E4.0 E4.1 E4.2 E4.3 E2.0 E2.1 E2.2",
    ("batch", MODEL_B): "E2.0 E2.1 E2.2 E4.0 E4.1 E4.2 E4.3 E5.0 E5.1",
    ("-batch", MODEL_B): "E5.0 E5.1 E4.0 E4.1 E4.2 E4.3 E2.0 E2.1 E2.2",
    ("seed", MODEL_B): "E2.0 E2.1 E2.2 E5.0 E5.1 E4.0 E4.1 E4.2 E4.3",
    ("-seed", MODEL_B): "E4.0 E4.1 E4.2 E4.3 E5.0 E5.1 E2.0 E2.1 E2.2",
    ("turn", MODEL_B): "E2.0 E4.0 E5.0 E2.1 E4.1 E5.1 E2.2 E4.2 E4.3",
    ("-turn", MODEL_B): "E4.3 E2.2 E4.2 E2.1 E4.1 E5.1 E2.0 E4.0 E5.0",
    ("reward", MODEL_B): "E2.0 E2.1 E4.0 E4.2 E5.1 E4.1 E2.2 E4.3 E5.0",
    ("-reward", MODEL_B): "E2.2 E4.3 E5.0 E4.1 E2.1 E4.0 E4.2 E5.1 E2.0",
    ("", FLAGGED): "E5.1 E4.1 E4.2 E2.2 E1.0",
    ("episode", FLAGGED): "E1.0 E2.2 E4.1 E4.2 E5.1",
    ("-episode", FLAGGED): "E5.1 E4.1 E4.2 E2.2 E1.0",
    ("batch", FLAGGED): "E1.0 E2.2 E4.1 E4.2 E5.1",
    ("-batch", FLAGGED): "E5.1 E4.1 E4.2 E2.2 E1.0",
    ("seed", FLAGGED): "E2.2 E1.0 E5.1 E4.1 E4.2",
    ("-seed", FLAGGED): "E4.1 E4.2 E5.1 E1.0 E2.2",
    ("turn", FLAGGED): "E1.0 E4.1 E5.1 E2.2 E4.2",
    ("-turn", FLAGGED): "E2.2 E4.2 E4.1 E5.1 E1.0",
    ("reward", FLAGGED): "E1.0 E4.2 E5.1 E4.1 E2.2",
    ("-reward", FLAGGED): "E2.2 E4.1 E1.0 E4.2 E5.1",
    ("", MODEL_B_FLAGGED): "E5.1 E4.1 E4.2 E2.2",
    ("episode", MODEL_B_FLAGGED): "E2.2 E4.1 E4.2 E5.1",
    ("-episode", MODEL_B_FLAGGED): "E5.1 E4.1 E4.2 E2.2",
    ("batch", MODEL_B_FLAGGED): "E2.2 E4.1 E4.2 E5.1",
    ("-batch", MODEL_B_FLAGGED): "E5.1 E4.1 E4.2 E2.2",
    ("seed", MODEL_B_FLAGGED): "E2.2 E5.1 E4.1 E4.2",
    ("-seed", MODEL_B_FLAGGED): "E4.1 E4.2 E5.1 E2.2",
    ("turn", MODEL_B_FLAGGED): "E4.1 E5.1 E2.2 E4.2",
    ("-turn", MODEL_B_FLAGGED): "E2.2 E4.2 E4.1 E5.1",
    ("reward", MODEL_B_FLAGGED): "E4.2 E5.1 E4.1 E2.2",
    ("-reward", MODEL_B_FLAGGED): "E2.2 E4.1 E4.2 E5.1",
}


def _labels(world: dict[int, str], page) -> list[str]:
    return [f"{world[turn.episode_id]}.{turn.index}" for turn in page]


def _walk(world, sort: str, selection: TurnSelection, size: int) -> list[list[str]]:
    """Every page from the first, following `next` cursors, then back again from the last
    following `previous` cursors: the pages going forwards (checked to be the same back)."""
    pages, cursors, after = [], [], None
    while True:
        page = turn_list_page(selection=selection, sort=sort, after=after, size=size)
        pages.append(_labels(world, page))
        cursors.append(page.previous_cursor)
        assert (page.previous_cursor is None) == (after is None)
        if page.next_cursor is None:
            break
        after = page.next_cursor
    back, before = [], cursors[-1]
    while before is not None:
        page = turn_list_page(selection=selection, sort=sort, before=before, size=size)
        back.append(_labels(world, page))
        before = page.previous_cursor
    assert back[::-1] == pages[:-1]
    return pages


@pytest.mark.parametrize(("sort", "selection"), list(EXPECTED))
def test_it_pages_through_each_sort_with_a_filter_in_order(world, sort, selection):
    expected = EXPECTED[(sort, selection)].split()
    # What one query in the whole order gives (the list before it was read other ways).
    assert _labels(world, turns_selected(selection).order_by(*TURN_SORTS[sort])) == expected
    for size in (2, 3, len(expected)):
        pages = _walk(world, sort, selection, size)
        assert [label for page in pages for label in page] == expected
        assert all(len(page) == size for page in pages[:-1])


def test_every_sort_is_covered(world):
    assert {sort for sort, _ in EXPECTED} == set(TURN_SORTS)


def test_the_page_shows_them_in_that_order(world, viewer_client):
    response = viewer_client.get(reverse("rollouts:turn_list"), {"model": "m-b", "sort": "seed"})
    assert _labels(world, response.context["page"]) == EXPECTED[("seed", MODEL_B)].split()
    response = viewer_client.get(
        reverse("rollouts:turn_list"), {"flagged": "only", "sort": "-reward"}
    )
    assert _labels(world, response.context["page"]) == EXPECTED[("-reward", FLAGGED)].split()
