"""The dataset filter and export options: one object for the command, the pages and the export.

A filter is a plain value (JSON-ready, stored on `Dataset.filters` and snapshotted on each
version). `turn_queryset` is the only place that turns it into SQL, so the live counts on the
page, the command and the Celery export always select the same turns.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import F, Q, QuerySet

from datasets.groups import grouping_on, kept_episodes
from rollouts.crafter_env import ACHIEVEMENTS
from rollouts.models import RolloutBatch, Turn

FLAGGED_CHOICES = ("any", "only", "exclude")
RELABELED_CHOICES = ("any", "only", "exclude")
FORMATS = ("studio", "openai", "synth")
# sft: one row per turn; preference: one row per pair of same-state answers (datasets.preferences)
KINDS = ("sft", "preference")
MAX_HISTORY_FRAMES = 9  # the current frame plus 9 is the provider's 10 images per row


class FilterError(ValueError):
    """A filter or export option is invalid; the message names it and says why, in one line."""


@dataclass(frozen=True)
class DatasetFilters:
    batches: tuple[int, ...] = ()
    models: tuple[str, ...] = ()
    policies: tuple[str, ...] = ()
    require_achievements: tuple[str, ...] = ()
    exclude_achievements: tuple[str, ...] = ()
    min_unique: int | None = None
    min_reward: float | None = None
    user_image: bool = False
    include_assistant: bool = False
    flagged: str = "any"
    exclude_errors: bool = False
    # Turns whose actions were read from the model's prose (Turn.text_fallback) carry a tool
    # call the model never made: left out unless asked for, then marked in the metadata.
    include_text_fallback: bool = False
    # Human in the loop: turns a reviewer corrected, and the replayed prefix of forks (the
    # original's turns again: left out unless asked for).
    relabeled: str = "any"
    include_fork_prefix: bool = False
    # best-of-N over the samples of each seed (datasets.groups)
    top_per_seed: int | None = None
    at_or_above_mean: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        for key in ("require_achievements", "exclude_achievements"):
            unknown = [a for a in getattr(self, key) if a not in ACHIEVEMENTS]
            if unknown:
                # synth-ai's exporter matched nothing here without a word; this is an error.
                raise FilterError(
                    f"{key.replace('_', '-')[:-1]}: unknown achievement {unknown[0]!r}; "
                    f"valid: {', '.join(ACHIEVEMENTS)}"
                )
        both = set(self.require_achievements) & set(self.exclude_achievements)
        if both:
            raise FilterError(
                f"achievement {sorted(both)[0]!r} is both required and excluded: nothing matches"
            )
        policies = [p.value for p in RolloutBatch.Policy]
        unknown_policies = [p for p in self.policies if p not in policies]
        if unknown_policies:
            raise FilterError(
                f"policy: unknown policy {unknown_policies[0]!r}; valid: {', '.join(policies)}"
            )
        if self.min_unique is not None and not 0 <= self.min_unique <= len(ACHIEVEMENTS):
            raise FilterError(f"min-unique: {self.min_unique} is not between 0 and 22")
        if self.min_reward is not None and self.min_reward != self.min_reward:
            raise FilterError("min-reward: not a number")
        if self.flagged not in FLAGGED_CHOICES:
            raise FilterError(
                f"flagged: {self.flagged!r} is not one of {', '.join(FLAGGED_CHOICES)}"
            )
        if self.relabeled not in RELABELED_CHOICES:
            raise FilterError(
                f"relabeled: {self.relabeled!r} is not one of {', '.join(RELABELED_CHOICES)}"
            )
        if self.top_per_seed is not None and not 1 <= self.top_per_seed <= 1000:
            raise FilterError(f"top-per-seed: {self.top_per_seed} is not between 1 and 1000")
        if any(b < 1 for b in self.batches):
            raise FilterError("batch: ids are positive integers")

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for key, value in data.items():
            if isinstance(value, tuple):
                data[key] = list(value)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> DatasetFilters:
        return _from_json(cls, data or {})


@dataclass(frozen=True)
class ExportOptions:
    history_frames: int = 0
    format: str = "studio"
    val_fraction: float = 0.0
    # An export that selects nothing is an error (a filter typo, not a dataset) unless asked.
    allow_empty: bool = False
    kind: str = "sft"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if not 0 <= self.history_frames <= MAX_HISTORY_FRAMES:
            raise FilterError(
                f"history-frames: {self.history_frames} is not between 0 and {MAX_HISTORY_FRAMES}"
            )
        if self.format not in FORMATS:
            raise FilterError(f"format: {self.format!r} is not one of {', '.join(FORMATS)}")
        if self.kind not in KINDS:
            raise FilterError(f"kind: {self.kind!r} is not one of {', '.join(KINDS)}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise FilterError(f"val-fraction: {self.val_fraction} is not in [0, 1)")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> ExportOptions:
        return _from_json(cls, data or {})


def _from_json(cls, data: dict[str, Any]):
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise FilterError(f"{unknown[0]}: unknown option; known: {', '.join(fields)}")
    values: dict[str, Any] = {}
    for name, value in data.items():
        default = fields[name].default
        try:
            if isinstance(default, tuple):
                if isinstance(value, str | int):
                    value = [value]
                caster = int if name == "batches" else str
                values[name] = tuple(caster(v) for v in value)
            elif isinstance(default, bool):
                values[name] = bool(value)
            elif name in ("min_unique", "history_frames", "top_per_seed"):
                values[name] = None if value in (None, "") else int(value)
            elif name in ("min_reward", "val_fraction"):
                values[name] = None if value in (None, "") else float(value)
            else:
                values[name] = value
        except (TypeError, ValueError) as exc:
            raise FilterError(f"{name}: {value!r} is not valid ({exc})") from exc
    if values.get("history_frames") is None and "history_frames" in values:
        values["history_frames"] = 0
    if values.get("val_fraction") is None and "val_fraction" in values:
        values["val_fraction"] = 0.0
    return cls(**values)


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


def turn_queryset(filters: DatasetFilters) -> QuerySet[Turn]:
    """Every turn the filter selects (unordered). Achievements are the episode's."""
    qs = Turn.objects.all()
    if filters.batches:
        qs = qs.filter(episode__batch_id__in=filters.batches)
    if filters.models:
        qs = qs.filter(episode__batch__model__in=filters.models)
    if filters.policies:
        qs = qs.filter(episode__batch__policy__in=filters.policies)
    if filters.require_achievements:
        qs = qs.filter(episode__achievements__has_keys=list(filters.require_achievements))
    if filters.exclude_achievements:
        qs = qs.exclude(episode__achievements__has_any_keys=list(filters.exclude_achievements))
    if filters.min_unique is not None:
        qs = qs.filter(episode__achievement_count__gte=filters.min_unique)
    if filters.min_reward is not None:
        qs = qs.filter(episode__total_reward__gte=filters.min_reward)
    if filters.user_image:
        qs = qs.filter(user_image_q())
    if filters.include_assistant:
        qs = qs.filter(assistant_image_q())
    if filters.flagged == "only":
        qs = qs.filter(flagged=True)
    elif filters.flagged == "exclude":
        qs = qs.filter(flagged=False)
    if filters.exclude_errors:
        qs = qs.filter(error="", error_kind="")
    if not filters.include_text_fallback:
        # A corrected turn's tool call is the reviewer's, not read from prose: it stays.
        qs = qs.filter(Q(text_fallback=False) | Q(relabel__isnull=False))
    # Human in the loop. A fork's first `fork_prefix_turns` turns replay its original.
    if not filters.include_fork_prefix:
        qs = qs.filter(index__gte=F("episode__fork_prefix_turns"))
    if filters.relabeled == "only":
        qs = qs.filter(relabel__isnull=False)
    elif filters.relabeled == "exclude":
        qs = qs.filter(relabel__isnull=True)
    if grouping_on(filters):
        qs = qs.filter(episode_id__in=kept_episodes(filters).values("id"))
    return qs


def check_combination(filters: DatasetFilters, options: ExportOptions) -> None:
    """Options that are valid alone but not together."""
    if options.kind == "preference" and options.format == "synth":
        # synth-ai's loader reads SFT rows; preference rows go out as studio or OpenAI's DPO.
        raise FilterError(
            "kind: preference rows are written in the studio or openai format, not synth"
        )
    if filters.include_text_fallback and options.format == "openai":
        # The openai format has no metadata: the inferred tool call could not be marked.
        raise FilterError(
            "include-text-fallback: the openai format has no metadata to mark text-fallback "
            "turns; use the studio format or leave them out"
        )


def check_references(filters: DatasetFilters) -> None:
    """Batches and models that do not exist are errors, not filters that match nothing."""
    if filters.batches:
        known = set(
            RolloutBatch.objects.filter(id__in=filters.batches).values_list("id", flat=True)
        )
        missing = [b for b in filters.batches if b not in known]
        if missing:
            raise FilterError(f"batch: there is no batch {missing[0]}")
    if filters.models:
        known_models = set(
            RolloutBatch.objects.filter(model__in=filters.models).values_list("model", flat=True)
        )
        missing_models = [m for m in filters.models if m not in known_models]
        if missing_models:
            used = sorted(
                set(RolloutBatch.objects.exclude(model="").values_list("model", flat=True))
            )[:20]
            raise FilterError(
                f"model: no batch was played by {missing_models[0]!r}; "
                f"known: {', '.join(used) or 'none'}"
            )
