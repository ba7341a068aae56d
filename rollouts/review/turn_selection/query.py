"""A `TurnSelection` as SQL: the one function that selects turns (`turns_selected`), with
the episode conditions, the checks of what a selection names, and best-of-N grouping."""

from __future__ import annotations

from typing import Any

from django.contrib.postgres.expressions import ArraySubquery
from django.db import connection
from django.db.models import (
    Avg,
    Count,
    Exists,
    F,
    FloatField,
    Lookup,
    OuterRef,
    Q,
    QuerySet,
    Window,
)
from django.db.models.functions import RowNumber

from rollouts.models import Episode, RolloutBatch, Turn
from rollouts.review.turn_selection.declaration import (
    FilterError,
    TurnSelection,
)


def turns_selected(
    selection: TurnSelection, *, for_pages: bool = False, episode_joined: bool = False
) -> QuerySet[Turn]:
    """Every turn the selection matches (unordered).

    Conditions on the episode and its batch are an EXISTS semi-join, never a join: a turn is
    matched at most once. `for_pages` (the turn list: pages in (episode desc, index) order,
    51 rows at a time) asks for `episode_id = ANY(ARRAY(matching episodes))` instead, on
    PostgreSQL: an index condition on every turn-list index, which all lead with the
    episode, so a page is read from the first matching episode on and stops at 51 rows. With
    a semi-join the planner, which cannot know where the matches are, walks the list's index
    from the newest turn: slow for a model whose newest batch is deep in the table. Not for
    whole-table reads (exports): a sequential scan would test each turn against the whole
    array; nor for counts: the planner's estimate, shown past STUDIO_EXACT_COUNT_UP_TO,
    assumes a short array.

    A dataset's include list (`include_turns`) is OR'ed in last: those turns are selected
    whatever the other conditions say.

    `episode_joined` (pages in the order of an episode's column: seed, batch) puts the
    conditions on the turn's own episode and batch rows, joined: the planner then walks the
    episodes in that column's order off an episode index (episode_seed_order_idx,
    episode_batch_order_idx), each tested once, and reads each one's turns, stopping at the
    page's end. With the array on the turn's episode_id instead it would sort every matching
    turn (millions, for a model at 10M turns).
    """
    qs = Turn.objects.all()
    if episode_joined:
        qs = _turn_conditions(qs.filter(_episode_conditions(selection, "episode__")), selection)
        return _with_included(qs, selection)
    episodes = _episodes_matching(selection)
    if episodes is not None:
        if for_pages and connection.vendor == "postgresql":
            qs = qs.filter(_AnyOf(F("episode_id"), ArraySubquery(episodes.values("id"))))
        else:
            qs = qs.filter(Exists(episodes.filter(id=OuterRef("episode_id"))))
    return _with_included(_turn_conditions(qs, selection), selection)


def _with_included(qs: QuerySet[Turn], selection: TurnSelection) -> QuerySet[Turn]:
    """The selected turns, and those of the include list whatever the other conditions."""
    if not selection.include_turns:
        return qs
    return qs | Turn.objects.filter(id__in=selection.include_turns)


def _turn_conditions(qs: QuerySet[Turn], selection: TurnSelection) -> QuerySet[Turn]:
    """The selection's conditions on the turn itself."""
    if selection.turn_ids:
        qs = qs.filter(id__in=selection.turn_ids)
    if selection.turn_unlocked:
        for name in selection.turn_unlocked:
            qs = qs.filter(_unlocked_lookup(name))
    if selection.reward == "positive":
        qs = qs.filter(reward__gt=0)
    elif selection.reward == "zero":
        qs = qs.filter(reward=0)
    elif selection.reward == "negative":
        qs = qs.filter(reward__lt=0)
    if selection.search:
        qs = qs.filter(
            Q(model_text__icontains=selection.search)
            | Q(note__icontains=selection.search)
            | Q(observation_text__icontains=selection.search)
        )
    if selection.user_image:
        qs = qs.filter(user_image_q())
    if selection.include_assistant:
        qs = qs.filter(assistant_image_q())
    if selection.flagged == "only":
        qs = qs.filter(flagged=True)
    elif selection.flagged == "exclude":
        qs = qs.filter(flagged=False)
    if selection.has_error == "yes":
        qs = qs.exclude(error="")
    elif selection.has_error == "no":
        qs = qs.filter(error="")
    if selection.exclude_errors:
        qs = qs.filter(error="", error_kind="")
    if not selection.include_text_fallback:
        # A corrected turn's tool call is the reviewer's, not read from prose: it stays.
        qs = qs.filter(Q(text_fallback=False) | Q(relabel__isnull=False))
    # Human in the loop. A fork's first `fork_prefix_turns` turns replay its original.
    if not selection.include_fork_prefix:
        qs = qs.filter(index__gte=F("episode__fork_prefix_turns"))
    if selection.relabeled == "only":
        qs = qs.filter(relabel__isnull=False)
    elif selection.relabeled == "exclude":
        qs = qs.filter(relabel__isnull=True)
    return qs


def _episodes_matching(selection: TurnSelection) -> QuerySet[Episode] | None:
    """The episode (and batch) conditions, or None when there are none."""
    conditions = _episode_conditions(selection)
    if not conditions:
        return None
    return Episode.objects.filter(conditions).order_by()


def has_episode_conditions(selection: TurnSelection) -> bool:
    """The selection narrows which episodes (or batches) the turns come from."""
    return bool(_episode_conditions(selection))


def _episode_conditions(selection: TurnSelection, prefix: str = "") -> Q:
    """The episode (and batch) conditions on an Episode (`prefix` "": the episode itself,
    "episode__": a turn's episode)."""
    p = prefix
    conditions = Q()
    if selection.batches:
        conditions &= Q(**{f"{p}batch_id__in": selection.batches})
    if selection.models:
        conditions &= Q(**{f"{p}batch__model__in": selection.models})
    if selection.policies:
        conditions &= Q(**{f"{p}batch__policy__in": selection.policies})
    if selection.seeds:
        conditions &= Q(**{f"{p}seed__in": selection.seeds})
    if selection.require_achievements:
        conditions &= Q(**{f"{p}achievements__has_keys": list(selection.require_achievements)})
    if selection.exclude_achievements:
        conditions &= ~Q(**{f"{p}achievements__has_any_keys": list(selection.exclude_achievements)})
    if selection.min_unique is not None:
        conditions &= Q(**{f"{p}achievement_count__gte": selection.min_unique})
    if selection.min_reward is not None:
        conditions &= Q(**{f"{p}total_reward__gte": selection.min_reward})
    if not selection.include_canceled:
        conditions &= ~Q(**{f"{p}status": Episode.Status.CANCELED})
    if grouping_on(selection):
        conditions &= Q(**{f"{p}id__in": kept_episodes(selection).values("id")})
    return conditions


class _AnyOf(Lookup):
    """`lhs = ANY(rhs)`, rhs an array (PostgreSQL)."""

    lookup_name = "any_of"
    prepare_rhs = False

    def as_sql(self, compiler, connection):
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self.process_rhs(compiler, connection)
        return f"{lhs} = ANY({rhs})", [*lhs_params, *rhs_params]


def _unlocked_lookup(name: str) -> Q:
    if connection.features.supports_json_field_contains:
        return Q(achievements_unlocked__contains=[name])
    # SQLite (the demo) has no JSON containment; the quoted name matches one list element.
    return Q(achievements_unlocked__icontains=f'"{name}"')


def _json_contains(field: str, value: Any) -> Q:
    """Containment on a JSON column; PostgreSQL does it natively, others by text search."""
    if connection.vendor == "postgresql":
        return Q(**{f"{field}__contains": value})
    # SQLite has no JSON containment: approximate by text. The export re-checks every row.
    return Q(**{f"{field}__icontains": "image_url"})


def user_image_q() -> Q:
    """The row's user messages show an image: always for rebuilt rows (they show the frame)."""
    return Q(request_messages=[]) | _json_contains(
        "request_messages", [{"role": "user", "content": [{"type": "image_url"}]}]
    )


def assistant_image_q() -> Q:
    """An assistant message of the row shows an image (only imported history can)."""
    if connection.vendor != "postgresql":
        return Q(pk__in=[])
    return _json_contains(
        "request_messages", [{"role": "assistant", "content": [{"type": "image_url"}]}]
    )


def check_references(selection: TurnSelection) -> None:
    """Batches and models that do not exist are errors, not filters that match nothing."""
    if selection.batches:
        known = set(
            RolloutBatch.objects.filter(id__in=selection.batches).values_list("id", flat=True)
        )
        missing = [b for b in selection.batches if b not in known]
        if missing:
            raise FilterError(f"batch: there is no batch {missing[0]}")
    if selection.models:
        known_models = set(
            RolloutBatch.objects.filter(model__in=selection.models).values_list("model", flat=True)
        )
        missing_models = [m for m in selection.models if m not in known_models]
        if missing_models:
            used = sorted(
                set(RolloutBatch.objects.exclude(model="").values_list("model", flat=True))
            )[:20]
            raise FilterError(
                f"model: no batch was played by {missing_models[0]!r}; "
                f"known: {', '.join(used) or 'none'}"
            )


# Best-of-N: episodes as groups of samples of one seed (rejection sampling).
#
# A group is the episodes of one seed in one batch (the K samples of `--samples-per-seed K`).
# Ranking and the group mean are over the group's finished episodes among the selection's
# batches, models and policies; its other conditions (achievements, minimum reward, turn
# flags) then apply to what the ranking keeps, so they never change which sample is "best".
#
# - `top_per_seed` n: the n best of each group, by unique achievements, then reward, then
#   sample index and id (so ties always break the same way: the earlier sample wins).
# - `at_or_above_mean`: episodes whose reward is at least the mean reward of their group.

# Float sums are not exact: a reward equal to its group's mean must count as at the mean.
MEAN_TOLERANCE = 1e-9
GROUP_ORDER = (
    F("achievement_count").desc(),
    F("total_reward").desc(),
    F("sample").asc(),
    F("id").asc(),
)


def grouping_on(selection: TurnSelection) -> bool:
    return selection.top_per_seed is not None or selection.at_or_above_mean


def ranked_episodes(selection: TurnSelection) -> QuerySet[Episode]:
    """The groups' finished episodes with `group_rank` (1 = best), `group_mean`, `group_size`."""
    qs = Episode.objects.filter(status=Episode.Status.FINISHED)
    if selection.batches:
        qs = qs.filter(batch_id__in=selection.batches)
    if selection.models:
        qs = qs.filter(batch__model__in=selection.models)
    if selection.policies:
        qs = qs.filter(batch__policy__in=selection.policies)
    partition = [F("batch_id"), F("seed")]
    return qs.annotate(
        group_rank=Window(RowNumber(), partition_by=partition, order_by=list(GROUP_ORDER)),
        group_mean=Window(Avg("total_reward"), partition_by=partition, output_field=FloatField()),
        group_size=Window(Count("id"), partition_by=partition),
    )


def kept_episodes(selection: TurnSelection) -> QuerySet[Episode]:
    """What the group conditions keep (filtering on window functions: Django wraps it)."""
    qs = ranked_episodes(selection)
    if selection.top_per_seed is not None:
        qs = qs.filter(group_rank__lte=selection.top_per_seed)
    if selection.at_or_above_mean:
        qs = qs.filter(total_reward__gte=F("group_mean") - MEAN_TOLERANCE)
    return qs
