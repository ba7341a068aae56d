"""Reads for the review pages: the filtered turn list, its choices, a turn, a bulk flag."""

from __future__ import annotations

import functools
from typing import Any

from django.db.models import (
    ExpressionWrapper,
    F,
    IntegerField,
    Q,
    QuerySet,
)

from rollouts.models import RolloutBatch, Turn, TurnBulkFlag
from rollouts.review.turn_selection import TurnSelection, has_episode_conditions, turns_selected
from studio.pagination import BoundedCount, KeysetPage, ValueGroups, count_bounded, keyset_page

# Sort keys of the turn list's columns -> the ordering they stand for; newest first by default.
# Each ends in a unique key (episode, index: turn_unique_episode_index) so that keyset pages
# (cursors) are exact. Every one is read off an index in its order, with or without filters
# (see `turn_list_page`): the default and the episode's by turn_list_order_idx, the batch's
# and seed's by episode_batch_order_idx / episode_seed_order_idx, the turn's index by
# turn_sort_index_idx (and _desc_idx), reward value by value (turn_sort_reward_idx,
# turn_episode_reward_idx).
TURN_SORTS: dict[str, tuple[str, ...]] = {
    "": ("-episode_id", "index"),
    "batch": ("episode__batch_id", "episode_id", "index"),
    "-batch": ("-episode__batch_id", "-episode_id", "index"),
    "episode": ("episode_id", "index"),
    "-episode": ("-episode_id", "index"),
    "seed": ("episode__seed", "episode_id", "index"),
    "-seed": ("-episode__seed", "-episode_id", "index"),
    "turn": ("index", "episode_id"),
    "-turn": ("-index", "episode_id"),
    "reward": ("reward", "episode_id", "index"),
    "-reward": ("-reward", "episode_id", "index"),
}
TURN_LIST_ORDER: tuple[str, ...] = TURN_SORTS[""]
_EPISODE_COLUMN_SORTS = frozenset({"batch", "-batch", "seed", "-seed"})


def _kept_by_partial_index(selection: TurnSelection) -> bool:
    """The selection keeps only turns one of the list's partial indexes holds (an unlocked
    achievement, a flag, an error message, a reward's sign): under 1% of turns in the
    benchmark's data."""
    return bool(
        selection.turn_unlocked
        or selection.flagged == "only"
        or selection.has_error == "yes"
        or selection.reward in ("positive", "negative")
    )


def turn_list_page(
    *,
    selection: TurnSelection,
    sort: str = "",
    after: str | None = None,
    before: str | None = None,
    size: int,
) -> KeysetPage:
    """One page of the turn list's `selection` in the `sort` column's order, by cursor
    (keyset), never by OFFSET: page 20,000 costs what page 1 costs.

    How the page is read depends on the order and the filters, so that PostgreSQL walks an
    index in that order and stops at the page's end (10 million turns):

    - by episode (the default): the matching episodes' ids, an array, are the condition on
      the turn list's index (`turns_selected(for_pages=True)`);
    - by the episode's seed or batch: the conditions on the joined episode row, walked in
      that order off an episode index, each episode's turns read in turn;
    - by the turn's index: its index in that order, each turn's episode tested on the joined
      row (`turn_sort_index_idx`, `turn_sort_index_desc_idx`);
    - by reward: value by value (`ValueGroups`), each value's turns of the matching
      episodes through an index on (episode, reward) or (reward, episode).

    With episode conditions and a turn condition of the few a partial index holds (see
    `_kept_by_partial_index`), the array's episodes are the condition on that index instead:
    all their matches, one read, sorted (at 10M, a model's `collect_wood` turns: 19,000).
    """
    order = TURN_SORTS.get(sort, TURN_LIST_ORDER)
    groups = None
    annotations: dict[str, Any] = {}
    partial = _kept_by_partial_index(selection)
    few = has_episode_conditions(selection) and partial
    if sort in _EPISODE_COLUMN_SORTS or (sort in ("turn", "-turn") and not few):
        turns = turns_selected(selection, episode_joined=True)
    else:
        turns = turns_selected(selection, for_pages=True)
        if sort in ("reward", "-reward") and not few:
            groups = ValueGroups(next_value=functools.partial(_turn_value, "reward"))
    if sort in ("turn", "-turn") and partial:
        # The partial index's matches, read whole from it and sorted (tens of thousands of
        # keys off the index alone, at 10M turns): "index + 0" keeps the planner off walking
        # turn_sort_index_idx, which it picks for a match it takes to be spread evenly. A
        # turn's reward and achievements come at one turn index (collect_wood's at 17): the
        # walk would read every other index's turns first.
        annotations = {"index_sorted": ExpressionWrapper(F("index") + 0, IntegerField())}
        turns = turns.annotate(**annotations)
        order = tuple(name.replace("index", "index_sorted") for name in order)
    return keyset_page(
        turns,
        order=order,
        after=after,
        before=before,
        size=size,
        # Keys as (episode, index): every index the list reads holds them (the partial ones
        # of each filter too), so the keys of a page sorted from thousands of matches come
        # from the index alone, not from as many turn rows (kilobytes each, on disk).
        key=("episode_id", "index"),
        load=lambda keys: turn_list_page_rows(turns=_turns_at(keys), sort=sort).annotate(
            **annotations
        ),
        groups=groups,
    )


def _turns_at(keys: list[tuple[int, int]]) -> QuerySet[Turn]:
    """The turns of these (episode, index) pairs: one condition per episode or per turn
    index, whichever makes fewer (a page holds a few episodes, or a few turn indexes when
    sorted by them): 51 pairs or-ed, one by one, are slow for PostgreSQL to plan."""
    by_episode: dict[int, list[int]] = {}
    by_index: dict[int, list[int]] = {}
    for episode_id, index in keys:
        by_episode.setdefault(episode_id, []).append(index)
        by_index.setdefault(index, []).append(episode_id)
    at = Q(pk__in=[])
    if len(by_episode) <= len(by_index):
        for episode_id, indexes in by_episode.items():
            at |= Q(episode_id=episode_id, index__in=indexes)
    else:
        for index, episodes in by_index.items():
            at |= Q(index=index, episode_id__in=episodes)
    return Turn.objects.filter(at)


def _turn_value(field: str, after: Any, descending: bool) -> Any:
    """The next value of the turn's `field` after `after` (the first when None), over every
    turn: one step along the index that leads with it."""
    turns = Turn.objects.all()
    if after is not None:
        turns = turns.filter(**{f"{field}__{'lt' if descending else 'gt'}": after})
    return (
        turns.order_by(f"-{field}" if descending else field).values_list(field, flat=True).first()
    )


def turns_count(*, turns: QuerySet[Turn]) -> BoundedCount:
    """How many turns match: exact up to STUDIO_EXACT_COUNT_UP_TO, else PostgreSQL's
    estimate ("about")."""
    return count_bounded(turns)


def turn_list_page_rows(*, turns: QuerySet[Turn], sort: str = "") -> QuerySet[Turn]:
    """What a page of the turn list needs, without the heavy request and observation text."""
    return (
        turns.select_related("episode__batch", "frame")
        .only(
            "id",
            "index",
            "model_text",
            "actions",
            "reward",
            "advantage",  # a reinforcement-learning run's, shown beside the reward
            "achievements_unlocked",
            "error",
            "error_kind",
            "flagged",
            "note",
            "episode__id",
            "episode__seed",
            "episode__sample",
            "episode__status",  # a canceled episode's turns are marked
            "episode__batch__id",
            "episode__batch__name",
            "episode__batch__model",
            "episode__batch__policy",
            "frame__id",
            "frame__sha256",
            "frame__step",
        )
        .order_by(*TURN_SORTS.get(sort, TURN_LIST_ORDER))
    )


def turn_filter_choices() -> dict[str, list[Any]]:
    """Batches and models offered by the turn list filters."""
    batches = list(RolloutBatch.objects.order_by("-id").values_list("id", "name", "policy"))
    # Without order_by() the model's default ordering (created_at, id) joined the DISTINCT:
    # one entry per batch, so a model of two batches was offered twice.
    models = sorted(
        RolloutBatch.objects.exclude(model="").order_by().values_list("model", flat=True).distinct()
    )
    return {"batches": batches, "models": models}


def turn_get(*, turn_id: int) -> Turn:
    return Turn.objects.get(id=turn_id)


def turn_bulk_flag_get(*, job_id: int) -> TurnBulkFlag:
    return TurnBulkFlag.objects.select_related("created_by").get(id=job_id)
