"""Reads for datasets."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.models import Count, IntegerField, QuerySet, Sum
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce, Length

from datasets.exporting import preview_rows
from datasets.filters import DatasetFilters, ExportOptions, turn_queryset
from datasets.groups import group_table, grouping_on
from datasets.jsonl import episode_split
from datasets.models import Dataset, DatasetImport, DatasetVersion
from datasets.preferences import count_pairs, preference_preview
from datasets.validation import CHARS_PER_TOKEN, MIN_ROWS
from rollouts.models import Episode, RolloutBatch, Turn
from rollouts.tools import SYSTEM_PROMPT

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
    aggregates["text_chars"] = Sum(Length("observation_text") + Coalesce(Length("model_text"), 0))
    counts = queryset.aggregate(**aggregates)
    counts.setdefault("images", counts["turns"])
    counts["images"] = counts["images"] or 0
    if options.val_fraction > 0:
        counts.update(_split_counts(queryset, options.val_fraction))
    else:
        counts.update(train_turns=counts["turns"], val_turns=0, val_episodes=0)
    counts["val_fraction"] = options.val_fraction
    # Estimates, said as such on the page: text at 4 characters a token plus the system
    # prompt and tool per row; a 64 px frame costs 255 tokens at auto detail and about
    # 12 KB of base64 in the file.
    text_chars = (counts.pop("text_chars") or 0) + counts["turns"] * (len(SYSTEM_PROMPT) + 900)
    counts["estimated_tokens"] = text_chars // CHARS_PER_TOKEN + counts["images"] * IMAGE_TOKENS
    counts["estimated_bytes"] = text_chars + counts["images"] * IMAGE_BYTES
    if options.kind == "preference":
        counts["pairs"] = count_pairs(filters, max_episodes=PAIR_COUNT_MAX_EPISODES)
    return counts


IMAGE_TOKENS = 255
IMAGE_BYTES = 12_000


def _split_counts(queryset: QuerySet[Turn], val_fraction: float) -> dict[str, int]:
    """Rows of the training and validation files: the split is by episode (jsonl)."""
    if val_fraction <= 0:
        total = queryset.count()
        return {"train_turns": total, "val_turns": 0, "val_episodes": 0}
    train = val = val_episodes = 0
    per_episode = queryset.values("episode_id", "episode__batch_id", "episode__seed").annotate(
        n=Count("id")
    )
    for row in per_episode.order_by():
        split = episode_split(
            batch_id=row["episode__batch_id"], seed=row["episode__seed"], val_fraction=val_fraction
        )
        if split == "val":
            val += row["n"]
            val_episodes += 1
        else:
            train += row["n"]
    return {"train_turns": train, "val_turns": val, "val_episodes": val_episodes}


def dataset_save_problems(*, filters: DatasetFilters, options: ExportOptions) -> list[str]:
    """Why a dataset with these settings could never be exported (checked when saved)."""
    if options.format != "openai":
        return []
    rows = _split_counts(turn_queryset(filters), options.val_fraction)["train_turns"]
    if rows < MIN_ROWS:
        return [
            f"The OpenAI format needs at least {MIN_ROWS} rows in the training file; "
            f"this filter selects {rows}."
        ]
    return []


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


def imports_recent(*, limit: int = 10) -> QuerySet[DatasetImport]:
    return DatasetImport.objects.select_related("created_by", "dataset").order_by("-id")[:limit]
