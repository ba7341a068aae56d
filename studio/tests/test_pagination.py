"""Keyset pages and bounded counts, on real PostgreSQL rows."""

from __future__ import annotations

import base64
import json

import pytest
from django.db import connection

from rollouts.models import Turn
from rollouts.tests.helpers import record_batch
from studio.pagination import ValueGroups, count_bounded, keyset_page

pytestmark = pytest.mark.django_db


@pytest.fixture
def turns() -> list[tuple[float, int]]:
    """Three played episodes (36 turns) with rewards that tie a lot: (reward, id) each."""
    batch = record_batch(policy="scripted", seeds=(1, 2, 3), steps=12)
    for turn in Turn.objects.filter(episode__batch=batch):
        Turn.objects.filter(id=turn.id).update(reward=float((turn.index * 7) % 3))
    return list(Turn.objects.values_list("reward", "id"))


def _walk(order: tuple[str, ...], size: int) -> tuple[list[int], list[str]]:
    """Follow `next` cursors from the first page to the last: ids in order, and the cursors."""
    ids, cursors, after = [], [], None
    while True:
        page = keyset_page(Turn.objects.all(), order=order, after=after, size=size)
        ids += [t.id for t in page]
        if page.next_cursor is None:
            return ids, cursors
        cursors.append(page.next_cursor)
        after = page.next_cursor


def test_it_visits_every_row_once_in_order_through_ties(turns):
    # Sorted here, by Python, not by the code under test.
    expected = [i for _, i in sorted(turns, key=lambda t: (-t[0], t[1]))]
    ids, cursors = _walk(("-reward", "id"), size=5)
    assert ids == expected
    assert len(cursors) == 7  # 36 rows in pages of 5: 8 pages
    ascending = [i for _, i in sorted(turns)]
    assert _walk(("reward", "id"), size=7)[0] == ascending


def test_it_walks_back_with_before_cursors(turns):
    order = ("-reward", "id")
    expected = [i for _, i in sorted(turns, key=lambda t: (-t[0], t[1]))]
    last = None
    after = None
    for _ in range(3):
        last = keyset_page(Turn.objects.all(), order=order, after=after, size=5)
        after = last.next_cursor
    assert [t.id for t in last] == expected[10:15]
    back = keyset_page(Turn.objects.all(), order=order, before=last.previous_cursor, size=5)
    assert [t.id for t in back] == expected[5:10]
    first = keyset_page(Turn.objects.all(), order=order, before=back.previous_cursor, size=5)
    assert [t.id for t in first] == expected[:5]
    assert first.previous_cursor is None and first.next_cursor


def _rewards_after(value, descending):
    """The next reward of any turn after `value` in that direction (the first when None)."""
    turns = Turn.objects.all()
    if value is not None:
        turns = turns.filter(reward__lt=value) if descending else turns.filter(reward__gt=value)
    return (
        turns.order_by("-reward" if descending else "reward")
        .values_list("reward", flat=True)
        .first()
    )


@pytest.mark.parametrize("max_values", [1, 2, 24])
@pytest.mark.parametrize("order", [("-reward", "id"), ("reward", "id")])
def test_it_reads_value_by_value_the_same_pages_forwards_and_back(turns, order, max_values):
    # max_values 1 and 2: past the bound, the rest of a page comes from one query.
    groups = ValueGroups(next_value=_rewards_after, max_values=max_values)
    expected = [
        i for _, i in sorted(turns, key=lambda t: (t[0] * (-1 if order[0][0] == "-" else 1), t[1]))
    ]
    pages, after = [], None
    while True:
        page = keyset_page(Turn.objects.all(), order=order, after=after, size=5, groups=groups)
        pages.append([t.id for t in page])
        if page.next_cursor is None:
            break
        after = page.next_cursor
    assert [i for p in pages for i in p] == expected
    assert all(len(p) == 5 for p in pages[:-1])
    back, before = [], page.previous_cursor
    while before is not None:
        page = keyset_page(Turn.objects.all(), order=order, before=before, size=5, groups=groups)
        back.append([t.id for t in page])
        before = page.previous_cursor
    assert back[::-1] == pages[:-1]


@pytest.mark.parametrize(
    "cursor",
    [
        "not base64 at all!",
        base64.urlsafe_b64encode(b"{not json").decode(),
        base64.urlsafe_b64encode(json.dumps([1]).encode()).decode(),  # wrong length
        base64.urlsafe_b64encode(json.dumps([{"a": 1}, 2]).encode()).decode(),
        base64.urlsafe_b64encode(json.dumps(["x\u0000", 2]).encode()).decode(),
        "A" * 5000,
    ],
)
def test_it_treats_a_forged_cursor_as_the_first_page(turns, cursor):
    page = keyset_page(Turn.objects.all(), order=("-reward", "id"), after=cursor, size=5)
    first = keyset_page(Turn.objects.all(), order=("-reward", "id"), size=5)
    assert [t.id for t in page] == [t.id for t in first]
    assert page.previous_cursor is None


@pytest.mark.parametrize(
    "values",
    [
        ["seven", 1, 2],  # a string for the episode's integer seed
        ["Infinity", 1, 2],  # JSON's Infinity (written below): no integer holds it
        [1, "x", 2],
    ],
)
def test_a_cursor_whose_values_do_not_fit_the_order_is_the_first_page(turns, values):
    # Sorted by a joined integer column, as the turn list's seed sort: the ORM refused these
    # values (ValueError, OverflowError) and the page answered 500.
    order = ("episode__seed", "episode_id", "index")
    text = json.dumps(values).replace('"Infinity"', "Infinity")
    cursor = base64.urlsafe_b64encode(text.encode()).decode()
    first = keyset_page(Turn.objects.all(), order=order, size=5)
    for direction in ("after", "before"):
        page = keyset_page(Turn.objects.all(), order=order, size=5, **{direction: cursor})
        assert [t.id for t in page] == [t.id for t in first], direction
        assert page.previous_cursor is None


def test_it_counts_exactly_up_to_the_bound_then_estimates(turns):
    exact = count_bounded(Turn.objects.all(), exact_up_to=36)
    assert (exact.value, exact.estimated) == (36, False)
    zero_reward = sum(1 for reward, _ in turns if reward == 0.0)
    counted = count_bounded(Turn.objects.filter(reward=0.0), exact_up_to=100)
    assert (counted.value, counted.estimated) == (zero_reward, False)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE rollouts_turn")
    estimate = count_bounded(Turn.objects.all(), exact_up_to=10)
    # Past the bound: the planner's figure (36 once analysed), at least bound + 1, rounded
    # to two significant figures, and marked as an estimate.
    assert estimate.estimated is True
    assert estimate.value == 36


def test_it_reads_keys_of_the_order_s_own_fields_then_their_rows(turns):
    # Keys as (episode, index), a unique pair the order ends in: the same pages as by id.
    order = ("-reward", "episode_id", "index")

    def load(keys):
        return Turn.objects.filter(
            id__in=[Turn.objects.get(episode_id=episode, index=index).id for episode, index in keys]
        )

    pages, after = [], None
    while True:
        page = keyset_page(
            Turn.objects.all(),
            order=order,
            after=after,
            size=7,
            load=load,
            key=("episode_id", "index"),
        )
        pages.append([t.id for t in page])
        if page.next_cursor is None:
            break
        after = page.next_cursor
    by_id, after = [], None
    while True:
        page = keyset_page(Turn.objects.all(), order=order, after=after, size=7)
        by_id.append([t.id for t in page])
        if page.next_cursor is None:
            break
        after = page.next_cursor
    assert pages == by_id and len(pages) == 6
