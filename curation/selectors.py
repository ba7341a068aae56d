"""Reads for datasets."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.models import Count, IntegerField, QuerySet, Subquery, Sum
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce, Length

from curation.export_options import ExportOptions
from curation.exporting import preview_rows
from curation.groups import group_table
from curation.jsonl import episode_split
from curation.models import Dataset, DatasetImport, DatasetVersion
from curation.preferences import count_pairs, preference_preview
from curation.row_formats import row_format
from curation.validation import CHARS_PER_TOKEN
from rollouts.game.tools import SYSTEM_PROMPT
from rollouts.models import Episode, RolloutBatch, Turn
from rollouts.review.turn_selection import TurnSelection, grouping_on, turns_selected
from studio.pagination import count_bounded, planner_estimate, round_estimate

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


def selection_size(*, filters: TurnSelection) -> dict[str, int]:
    """The turns and episodes a filter selects, counted exactly (a command's answer, not a
    page's live estimate)."""
    return turns_selected(filters).aggregate(
        turns=Count("id"), episodes=Count("episode_id", distinct=True)
    )


def version_models(*, version: DatasetVersion) -> list[str]:
    """The models that played the turns of a version's filter (scripted, random and people's
    games name none), sorted."""
    selected = turns_selected(TurnSelection.from_json(version.filters))
    models = selected.exclude(episode__batch__model="").values_list("episode__batch__model")
    return sorted({model for (model,) in models.order_by().distinct()})


# Turns read to estimate the images per turn of a large selection: the cost stays flat.
ESTIMATE_SAMPLE_TURNS = 2_000


def dataset_counts(*, filters: TurnSelection, options: ExportOptions) -> dict[str, Any]:
    """Turns, episodes and images the export would write (images exact on PostgreSQL).

    Exact while at most STUDIO_EXACT_COUNT_UP_TO turns match. Past that, counting exactly
    would read every matching turn (seconds at millions), so `estimated` is True, the page
    says "about", and: turns are PostgreSQL's estimate; episodes assume the selection's
    episodes are as long as the average episode (all episodes / all turns); images, tokens
    and bytes per turn come from the first ESTIMATE_SAMPLE_TURNS matching turns in export
    order; the validation split is its expected share.
    """
    queryset = turns_selected(filters)
    turns = count_bounded(queryset)
    pairs: dict[str, Any] = {}
    if options.kind == "preference":
        pairs["pairs"] = count_pairs(filters, max_episodes=PAIR_COUNT_MAX_EPISODES)
    if not turns.estimated:
        return {**_aggregate(queryset, options), **pairs, "estimated": False}
    sample_ids = queryset.order_by("episode_id", "index").values("pk")[:ESTIMATE_SAMPLE_TURNS]
    sample = _aggregate(Turn.objects.filter(pk__in=Subquery(sample_ids)), options)
    all_turns = max(planner_estimate(Turn.objects.all()), 1)
    episodes = round(Episode.objects.count() * min(turns.value, all_turns) / all_turns)
    episodes = max(1, min(turns.value, episodes))
    per_turn = turns.value / max(sample["turns"], 1)
    # The split is by a hash of each episode: on this many, its expected share.
    val_fraction = options.val_fraction
    return {
        "turns": turns.value,
        "episodes": round_estimate(episodes),
        "images": round_estimate(round(sample["images"] * per_turn)),
        "train_turns": round_estimate(round(turns.value * (1 - val_fraction))),
        "val_turns": round_estimate(round(turns.value * val_fraction)),
        "val_episodes": round_estimate(round(episodes * val_fraction)),
        "val_fraction": val_fraction,
        "estimated_tokens": round_estimate(round(sample["estimated_tokens"] * per_turn)),
        "estimated_bytes": round(sample["estimated_bytes"] * per_turn),
        **pairs,
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


def dataset_save_problems(*, filters: TurnSelection, options: ExportOptions) -> list[str]:
    """Why a dataset with these settings could never be exported (checked when saved)."""
    declared = row_format(options.format)
    if not declared.min_train_rows:
        return []
    rows = _split_counts(turns_selected(filters), options.val_fraction)["train_turns"]
    if rows < declared.min_train_rows:
        return [
            f"The {declared.label} format needs at least {declared.min_train_rows} rows in "
            "the training file; "
            f"this filter selects {rows}."
        ]
    return []


def dataset_groups(*, filters: TurnSelection, limit: int = 12) -> dict[str, Any] | None:
    """With a best-of-N filter: what each seed's group keeps (None without one)."""
    return group_table(filters, limit=limit) if grouping_on(filters) else None


def dataset_pair_preview(
    *, filters: TurnSelection, options: ExportOptions, limit: int = 5
) -> list[dict[str, Any]] | None:
    """For a preference dataset, its first pairs (None for one row per turn)."""
    if options.kind != "preference":
        return None
    return preference_preview(filters, limit=limit)


def dataset_preview(
    *, filters: TurnSelection, options: ExportOptions, limit: int = 5
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
