"""Episodes as groups of samples of one seed: best-of-N selection (rejection sampling).

A group is the episodes of one seed in one batch (the K samples of `--samples-per-seed K`).
Ranking and the group mean are over the group's finished episodes among the filter's batches,
models and policies; the filter's other conditions (achievements, minimum reward, turn
flags) then apply to what the ranking keeps, so they never change which sample is "best".

- `top_per_seed` n: the n best of each group, by unique achievements, then reward, then
  sample index and id (so ties always break the same way: the earlier sample wins).
- `at_or_above_mean`: episodes whose reward is at least the mean reward of their group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db.models import Avg, Count, F, FloatField, QuerySet, Window
from django.db.models.functions import RowNumber

from rollouts.models import Episode

if TYPE_CHECKING:
    from datasets.filters import DatasetFilters

# Float sums are not exact: a reward equal to its group's mean must count as at the mean.
MEAN_TOLERANCE = 1e-9
GROUP_ORDER = (
    F("achievement_count").desc(),
    F("total_reward").desc(),
    F("sample").asc(),
    F("id").asc(),
)


def grouping_on(filters: DatasetFilters) -> bool:
    return filters.top_per_seed is not None or filters.at_or_above_mean


def ranked_episodes(filters: DatasetFilters) -> QuerySet[Episode]:
    """The groups' finished episodes with `group_rank` (1 = best), `group_mean`, `group_size`."""
    qs = Episode.objects.filter(status=Episode.Status.FINISHED)
    if filters.batches:
        qs = qs.filter(batch_id__in=filters.batches)
    if filters.models:
        qs = qs.filter(batch__model__in=filters.models)
    if filters.policies:
        qs = qs.filter(batch__policy__in=filters.policies)
    partition = [F("batch_id"), F("seed")]
    return qs.annotate(
        group_rank=Window(RowNumber(), partition_by=partition, order_by=list(GROUP_ORDER)),
        group_mean=Window(Avg("total_reward"), partition_by=partition, output_field=FloatField()),
        group_size=Window(Count("id"), partition_by=partition),
    )


def kept_episodes(filters: DatasetFilters) -> QuerySet[Episode]:
    """What the group conditions keep (filtering on window functions: Django wraps it)."""
    qs = ranked_episodes(filters)
    if filters.top_per_seed is not None:
        qs = qs.filter(group_rank__lte=filters.top_per_seed)
    if filters.at_or_above_mean:
        qs = qs.filter(total_reward__gte=F("group_mean") - MEAN_TOLERANCE)
    return qs


def kept_episode_ids(filters: DatasetFilters) -> list[int]:
    return list(kept_episodes(filters).values_list("id", flat=True))


def group_table(filters: DatasetFilters, *, limit: int = 12) -> dict[str, Any]:
    """What each group keeps, for the live counts and the preview: the first `limit` groups."""
    kept = set(kept_episode_ids(filters))
    groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
    total_groups = 0
    rows = ranked_episodes(filters).order_by("batch_id", "seed", "group_rank")
    for episode in rows.values(
        "id", "batch_id", "seed", "sample", "achievement_count", "total_reward", "group_rank",
        "group_mean",
    ):  # fmt: skip
        key = (episode["batch_id"], episode["seed"])
        if key not in groups:
            total_groups += 1
            if len(groups) >= limit:
                continue
            groups[key] = []
        episode["kept"] = episode["id"] in kept
        groups[key].append(episode)
    return {
        "groups": [
            {
                "batch_id": key[0],
                "seed": key[1],
                "mean_reward": members[0]["group_mean"],
                "episodes": members,
                "kept": sum(1 for e in members if e["kept"]),
            }
            for key, members in groups.items()
        ],
        "total_groups": total_groups,
        "kept_episodes": len(kept),
        "shown": min(limit, total_groups),
    }
