"""Reads for datasets."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.models import Count, IntegerField, QuerySet, Sum
from django.db.models.expressions import RawSQL

from datasets.exporting import preview_rows
from datasets.filters import DatasetFilters, ExportOptions, turn_queryset
from datasets.groups import group_table, grouping_on
from datasets.models import Dataset, DatasetVersion
from datasets.preferences import count_pairs, preference_preview
from rollouts.models import Episode, RolloutBatch, Turn

# Image parts of a recorded request; a rebuilt row shows its frame plus up to K history frames.
_IMAGES_SQL = (
    "CASE WHEN {t}.request_messages = '[]'::jsonb THEN 1 + LEAST({t}.\"index\", %s) "
    "ELSE jsonb_array_length(jsonb_path_query_array({t}.request_messages, "
    "'$[*].content[*] ? (@.type == \"image_url\")', '{{}}', true)) END"
)


# Counting pairs reads every turn of the episodes: past this many, the export counts them.
PAIR_COUNT_MAX_EPISODES = 2000


def datasets_recent() -> QuerySet[Dataset]:
    return Dataset.objects.select_related("created_by").annotate(version_count=Count("versions"))


def dataset_versions(*, dataset: Dataset) -> QuerySet[DatasetVersion]:
    return dataset.versions.select_related("created_by").order_by("-number")


def dataset_counts(*, filters: DatasetFilters, options: ExportOptions) -> dict[str, int]:
    """Turns, episodes and images the export would write (images exact on PostgreSQL)."""
    queryset = turn_queryset(filters)
    aggregates: dict[str, Any] = {
        "turns": Count("id"),
        "episodes": Count("episode_id", distinct=True),
    }
    if connection.vendor == "postgresql":
        table = connection.ops.quote_name(Turn._meta.db_table)
        aggregates["images"] = Sum(
            RawSQL(_IMAGES_SQL.format(t=table), (options.history_frames,)),
            output_field=IntegerField(),
        )
    counts = queryset.aggregate(**aggregates)
    counts.setdefault("images", counts["turns"])
    counts["images"] = counts["images"] or 0
    if options.kind == "preference":
        counts["pairs"] = count_pairs(filters, max_episodes=PAIR_COUNT_MAX_EPISODES)
    return counts


def dataset_groups(*, filters: DatasetFilters, limit: int = 12) -> dict[str, Any] | None:
    """With a best-of-N filter: what each seed's group keeps (None without one)."""
    return group_table(filters, limit=limit) if grouping_on(filters) else None


def dataset_pair_preview(
    *, filters: DatasetFilters, options: ExportOptions, limit: int = 5
) -> list[dict[str, Any]] | None:
    """For a preference dataset, its first pairs (None for one row per turn)."""
    if options.kind != "preference":
        return None
    return preference_preview(filters, limit=limit)


def dataset_preview(
    *, filters: DatasetFilters, options: ExportOptions, limit: int = 5
) -> list[dict[str, Any]]:
    rows = preview_rows(filters=filters, options=options, limit=limit)
    # Which sample of its seed each row comes from, so best-of-N filters can be checked by eye.
    ids = {row["metadata"]["episode_id"] for row in rows}
    samples = dict(Episode.objects.filter(id__in=ids).values_list("id", "sample"))
    for row in rows:
        row["sample"] = samples.get(row["metadata"]["episode_id"], 0)
    return rows


def filter_choices() -> dict[str, list]:
    """What the filter form offers: batches, models and policies that exist."""
    return {
        "batches": list(RolloutBatch.objects.order_by("-id").values_list("id", "name", "policy")),
        "models": sorted(
            set(RolloutBatch.objects.exclude(model="").values_list("model", flat=True))
        ),
    }
