"""Which turns: one declaration of the turn filter, and the one function that makes it SQL.

The turn list (its page, its counts and its bulk flag) and datasets (their live counts,
versions, exports, preference pairs, evaluation seeds) all select turns here, so a filter
means the same thing wherever it is used.

A selection is a plain value, JSON-ready: stored on `Dataset.filters`, snapshotted on each
`DatasetVersion`, and on `TurnBulkFlag.filters`. A key missing from stored JSON takes the
field's default, so the defaults are a dataset's: fork prefixes and turns whose actions were
read from prose are left out unless asked for. The turn list shows every turn
(`EVERY_TURN`) and narrows it from there.

Achievements have two meanings, both kept as options of their own:

- `turn_unlocked`: the turn itself unlocked each of these (`Turn.achievements_unlocked`);
  the turn list's "Unlocked" filter.
- `require_achievements` / `exclude_achievements`: the turn's *episode* unlocked all / none
  of these at some turn (`Episode.achievements`); a dataset's filter, which keeps every
  turn of a good episode.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
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

from rollouts.game.crafter_env import ACHIEVEMENTS
from rollouts.models import Episode, RolloutBatch, Turn

FLAGGED_CHOICES = ("any", "only", "exclude")
# How the pages (turn list, datasets) name them.
FLAGGED_LABELS = {"any": "any", "only": "flagged only", "exclude": "not flagged"}
RELABELED_CHOICES = ("any", "only", "exclude")
ERROR_CHOICES = ("any", "yes", "no")
REWARD_CHOICES = ("any", "positive", "zero", "negative")


# Batch ids and seeds are PostgreSQL bigints: a number past this went into a query and
# came back a 500 (OverflowError), not an empty page.
BIGINT_MAX = 2**63 - 1


class FilterError(ValueError):
    """A filter or export option is invalid; the message names it and says why, in one line."""


@dataclass(frozen=True)
class TurnSelection:
    # Where the turns were played.
    batches: tuple[int, ...] = ()
    models: tuple[str, ...] = ()
    policies: tuple[str, ...] = ()
    seeds: tuple[int, ...] = ()
    # Per episode: it unlocked all of `require_achievements` and none of
    # `exclude_achievements`, at least `min_unique` in all, for at least `min_reward`.
    require_achievements: tuple[str, ...] = ()
    exclude_achievements: tuple[str, ...] = ()
    min_unique: int | None = None
    min_reward: float | None = None
    # Per turn: the turn itself unlocked each of these; its own reward's sign.
    turn_unlocked: tuple[str, ...] = ()
    reward: str = "any"
    # Model text, note or observation text contains this, case-insensitive.
    search: str = ""
    user_image: bool = False
    include_assistant: bool = False
    flagged: str = "any"
    # Two error filters of their own: `has_error` is the turn list's (the error message),
    # `exclude_errors` a dataset's (neither an error message nor an error kind).
    has_error: str = "any"
    exclude_errors: bool = False
    # Turns whose actions were read from the model's prose (Turn.text_fallback) carry a tool
    # call the model never made: left out unless asked for, then marked in the metadata.
    include_text_fallback: bool = False
    # Human in the loop: turns a reviewer corrected, and the replayed prefix of forks (the
    # original's turns again: left out unless asked for).
    relabeled: str = "any"
    include_fork_prefix: bool = False
    # best-of-N over the samples of each seed (see `kept_episodes`)
    top_per_seed: int | None = None
    at_or_above_mean: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        for key in ("require_achievements", "exclude_achievements", "turn_unlocked"):
            unknown = [a for a in getattr(self, key) if a not in ACHIEVEMENTS]
            if unknown:
                # synth-ai's exporter matched nothing here without a word; this is an error.
                name = "unlocked" if key == "turn_unlocked" else key.replace("_", "-")[:-1]
                raise FilterError(
                    f"{name}: unknown achievement {unknown[0]!r}; valid: {', '.join(ACHIEVEMENTS)}"
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
        if self.min_reward is not None and not math.isfinite(self.min_reward):
            raise FilterError("min-reward: not a finite number")
        for key, choices in (
            ("flagged", FLAGGED_CHOICES),
            ("relabeled", RELABELED_CHOICES),
            ("has_error", ERROR_CHOICES),
            ("reward", REWARD_CHOICES),
        ):
            if getattr(self, key) not in choices:
                raise FilterError(
                    f"{key.replace('_', '-')}: {getattr(self, key)!r} is not one of "
                    f"{', '.join(choices)}"
                )
        if self.top_per_seed is not None and not 1 <= self.top_per_seed <= 1000:
            raise FilterError(f"top-per-seed: {self.top_per_seed} is not between 1 and 1000")
        if any(not 1 <= b <= BIGINT_MAX for b in self.batches):
            raise FilterError(f"batch: ids are integers from 1 to {BIGINT_MAX}")
        if any(not 0 <= s <= BIGINT_MAX for s in self.seeds):
            raise FilterError(f"seed: seeds are integers from 0 to {BIGINT_MAX}")

    def to_json(self) -> dict[str, Any]:
        return options_to_json(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> TurnSelection:
        return options_from_json(cls, data or {})


# The turn list's starting point: every turn, whatever the dataset defaults leave out.
EVERY_TURN = TurnSelection(include_text_fallback=True, include_fork_prefix=True)

# Option fields read as integers or floats, None when empty (any option dataclass).
_INT_OPTIONS = ("min_unique", "history_frames", "top_per_seed")
_FLOAT_OPTIONS = ("min_reward", "val_fraction")
_INT_TUPLES = ("batches", "seeds")


def options_to_json(options: Any) -> dict[str, Any]:
    """An options dataclass as JSON: tuples become lists."""
    data = dataclasses.asdict(options)
    for key, value in data.items():
        if isinstance(value, tuple):
            data[key] = list(value)
    return data


def options_from_json(cls, data: dict[str, Any]):
    """An options dataclass from JSON (stored, or given by a form): names and types checked,
    a missing key takes the field's default."""
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
                caster = int if name in _INT_TUPLES else str
                values[name] = tuple(caster(v) for v in value)
            elif isinstance(default, bool):
                values[name] = bool(value)
            elif name in _INT_OPTIONS:
                values[name] = None if value in (None, "") else int(value)
            elif name in _FLOAT_OPTIONS:
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


def turns_selected(
    selection: TurnSelection, *, for_pages: bool = False, episode_joined: bool = False
) -> QuerySet[Turn]:
    """Every turn the selection matches (unordered).

    Conditions on the episode and its batch are an EXISTS semi-join, never a join: a turn is
    matched at most once. `for_pages` (the turn list: pages in (episode desc, index) order,
    51 rows at a time) asks for `episode_id = ANY(ARRAY(matching episodes))` instead, on
    PostgreSQL: an index condition on every turn-list index, which all lead with the
    episode, so a page is read from the first matching episode on and stops at 51 rows.
    With the semi-join the planner, which cannot know where the matches are, walked the
    list's index from the newest turn: 1-2 s at 10M turns for a model whose newest batch is
    1,000 episodes deep. Not for whole-table reads (exports): a sequential scan would test
    each turn against the whole array; nor for counts: the planner's estimate, shown past
    STUDIO_EXACT_COUNT_UP_TO, assumes a short array.

    `episode_joined` (pages in the order of an episode's column: seed, batch) puts the
    conditions on the turn's own episode and batch rows, joined: the planner then walks the
    episodes in that column's order off an episode index (episode_seed_order_idx,
    episode_batch_order_idx), each tested once, and reads each one's turns, stopping at the
    page's end. With the array on the turn's episode_id instead it sorted every matching turn
    (a model's 3.3 million turns at 10M: 5.6 s).
    """
    qs = Turn.objects.all()
    if episode_joined:
        return _turn_conditions(qs.filter(_episode_conditions(selection, "episode__")), selection)
    episodes = _episodes_matching(selection)
    if episodes is not None:
        if for_pages and connection.vendor == "postgresql":
            qs = qs.filter(_AnyOf(F("episode_id"), ArraySubquery(episodes.values("id"))))
        else:
            qs = qs.filter(Exists(episodes.filter(id=OuterRef("episode_id"))))
    return _turn_conditions(qs, selection)


def _turn_conditions(qs: QuerySet[Turn], selection: TurnSelection) -> QuerySet[Turn]:
    """The selection's conditions on the turn itself."""
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
