"""Reads for datasets."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.models import Count, IntegerField, QuerySet, Subquery, Sum
from django.db.models.expressions import RawSQL

from datasets.exporting import preview_rows
from datasets.filters import DatasetFilters, ExportOptions, turn_queryset
from datasets.models import Dataset, DatasetVersion
from rollouts.models import Episode, RolloutBatch, Turn
from studio.pagination import count_bounded, planner_estimate, round_estimate

# Image parts of a recorded request; a rebuilt row shows its frame plus up to K history frames.
_IMAGES_SQL = (
    "CASE WHEN {t}.request_messages = '[]'::jsonb THEN 1 + LEAST({t}.\"index\", %s) "
    "ELSE jsonb_array_length(jsonb_path_query_array({t}.request_messages, "
    "'$[*].content[*] ? (@.type == \"image_url\")', '{{}}', true)) END"
)


def datasets_recent() -> QuerySet[Dataset]:
    return Dataset.objects.select_related("created_by").annotate(version_count=Count("versions"))


def dataset_versions(*, dataset: Dataset) -> QuerySet[DatasetVersion]:
    return dataset.versions.select_related("created_by").order_by("-number")


# Turns read to estimate the images per turn of a large selection (~50 ms at any size).
ESTIMATE_SAMPLE_TURNS = 2_000


def dataset_counts(*, filters: DatasetFilters, options: ExportOptions) -> dict[str, Any]:
    """Turns, episodes and images the export would write (images exact on PostgreSQL).

    Exact while at most STUDIO_EXACT_COUNT_UP_TO turns match. Past that, counting exactly
    would read every matching turn (seconds at millions), so `estimated` is True, the page
    says "about", and: turns are PostgreSQL's estimate; episodes assume the selection's
    episodes are as long as the average episode (all episodes / all turns); images per turn
    come from the first ESTIMATE_SAMPLE_TURNS matching turns in export order.
    """
    queryset = turn_queryset(filters)
    turns = count_bounded(queryset)
    if not turns.estimated:
        return {**_aggregate(queryset, options), "estimated": False}
    sample_ids = queryset.order_by("episode_id", "index").values("pk")[:ESTIMATE_SAMPLE_TURNS]
    sample = _aggregate(Turn.objects.filter(pk__in=Subquery(sample_ids)), options)
    all_turns = max(planner_estimate(Turn.objects.all()), 1)
    episodes = Episode.objects.count() * min(turns.value, all_turns) / all_turns
    return {
        "turns": turns.value,
        "episodes": round_estimate(max(1, min(turns.value, round(episodes)))),
        "images": round_estimate(round(turns.value * sample["images"] / max(sample["turns"], 1))),
        "estimated": True,
    }


def _aggregate(queryset: QuerySet[Turn], options: ExportOptions) -> dict[str, int]:
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
    return counts


def dataset_preview(
    *, filters: DatasetFilters, options: ExportOptions, limit: int = 5
) -> list[dict[str, Any]]:
    return preview_rows(filters=filters, options=options, limit=limit)


def filter_choices() -> dict[str, list]:
    """What the filter form offers: batches, models and policies that exist."""
    return {
        "batches": list(RolloutBatch.objects.order_by("-id").values_list("id", "name", "policy")),
        "models": sorted(
            set(RolloutBatch.objects.exclude(model="").values_list("model", flat=True))
        ),
    }
