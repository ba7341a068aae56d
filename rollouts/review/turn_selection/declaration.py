"""The turn filter, declared once: each field of `TurnSelection` with its label, help, flag,
query name, choices and bounds; the dataset form, the export flags and the turn list's form
are made from it. A plain value, JSON-ready."""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass
from typing import Any

from rollouts.game.crafter_env import ACHIEVEMENTS
from rollouts.policies.kinds import policy_choices

FLAGGED_CHOICES = ("any", "only", "exclude")
# How the pages (turn list, datasets) name them.
FLAGGED_LABELS = {"any": "any", "only": "flagged only", "exclude": "not flagged"}
RELABELED_CHOICES = ("any", "only", "exclude")
ERROR_CHOICES = ("any", "yes", "no")
REWARD_CHOICES = ("any", "positive", "zero", "negative")


# Batch ids and seeds are PostgreSQL bigints: a number past this went into a query and
# came back a 500 (OverflowError), not an empty page.
BIGINT_MAX = 2**63 - 1

# Turns picked by hand (the turn list's checkboxes): a page holds 50. Under Django's 1,000
# fields a request may carry (DATA_UPLOAD_MAX_NUMBER_FIELDS), with the filters beside them.
TURN_IDS_MAX = 500
# A dataset's include list ("add to dataset" on the turn list), stored in its filter's JSON.
INCLUDE_TURNS_MAX = 10_000
# How many of a long list of ids a summary shows.
SHOWN_ITEMS = 10


class FilterError(ValueError):
    """A filter or export option is invalid; the message names it and says why, in one line."""


@dataclass(frozen=True)
class Filter:
    """How one filter of `TurnSelection` shows on each face.

    The dataset form (`curation.forms`), the export commands' flags
    (`curation.command_options`), the turn list's form and address query
    (`rollouts.review.forms`) and a selection's summary (`selection_summary`, the bulk-flag
    confirmation) are all made from these, and `TurnSelection.validate` checks the choices and
    bounds declared here: a filter declared once appears on every face that names it, with
    the same choices and bounds. A tuple filter is a list on the dataset form and the command
    line, one value on the turn list.
    """

    label: str = ""  # the dataset form's label; empty: Django's, from the field name
    help: str = ""  # the dataset form's help text
    dataset: bool = False  # a field of the dataset form
    required: bool = False  # the dataset form refuses it empty
    flag: str = ""  # the export commands' flag (without "--"); empty: no flag
    flag_help: str = ""
    metavar: str | None = None
    query: str = ""  # the turn list's field and address-query name; empty: not on the list
    query_label: str = ""  # the turn list's label; empty: Django's, from `query`
    query_help: str = ""
    max_length: int | None = None  # a text's, on the turn list
    # A str filter's values, or the items a tuple filter may hold (none: any).
    choices: tuple[str, ...] = ()
    choice_labels: tuple[tuple[str, str], ...] = ()  # the pages' words for some choices
    item: str = ""  # what one item of a tuple filter is called in messages
    # A number's bounds (each item's, for a tuple), and what is said outside them instead of
    # "N is not between A and B".
    minimum: int | None = None
    maximum: int | None = None
    bounds_message: str = ""
    max_items: int | None = None  # a tuple filter's longest
    word: str = ""  # how messages name it when it has neither a flag nor a list label
    # Left out of the JSON while at its default, so a selection stored before the filter
    # existed (a dataset, a version's snapshot, a Hugging Face card) keeps its bytes.
    omitted_at_default: bool = False

    @property
    def dest(self) -> str:
        """The flag's key in a command's options."""
        return self.flag.replace("-", "_")

    def choice_label(self, value: str) -> str:
        return dict(self.choice_labels).get(value, value)


def filter_option(default: Any, **meta: Any) -> Any:
    """A field of TurnSelection with its Filter."""
    return dataclasses.field(default=default, metadata={"filter": Filter(**meta)})


_ACHIEVEMENT_ITEMS = {"choices": ACHIEVEMENTS, "item": "achievement"}


@dataclass(frozen=True)
class TurnSelection:
    # Where the turns were played.
    batches: tuple[int, ...] = filter_option(
        (),
        dataset=True,
        help="Turns of these batches only; none ticked means every batch.",
        flag="batch",
        metavar="ID",
        query="batch",
        minimum=1,
        maximum=BIGINT_MAX,
        bounds_message=f"ids are integers from 1 to {BIGINT_MAX}",
    )
    models: tuple[str, ...] = filter_option(
        (),
        dataset=True,
        help="Turns played by these models; none ticked means any.",
        flag="model",
        metavar="M",
        query="model",
        max_length=200,
    )
    policies: tuple[str, ...] = filter_option(
        (),
        dataset=True,
        help="openai (a model), the scripted and random baselines, or imported rows.",
        query="policy",
        choices=tuple(name for name, _ in policy_choices()),  # every declared kind
        item="policy",
    )
    seeds: tuple[int, ...] = filter_option(
        (),
        query="seed",
        minimum=0,
        maximum=BIGINT_MAX,
        bounds_message=f"seeds are integers from 0 to {BIGINT_MAX}",
    )
    # Per episode: it unlocked all of `require_achievements` and none of
    # `exclude_achievements`, at least `min_unique` in all, for at least `min_reward`.
    require_achievements: tuple[str, ...] = filter_option(
        (),
        dataset=True,
        label="Required achievements",
        help="Episodes that unlocked all of these (at any turn).",
        flag="require-achievement",
        metavar="A",
        **_ACHIEVEMENT_ITEMS,
    )
    exclude_achievements: tuple[str, ...] = filter_option(
        (),
        dataset=True,
        label="Excluded achievements",
        help="Leave out episodes that unlocked any of these.",
        flag="exclude-achievement",
        metavar="A",
        **_ACHIEVEMENT_ITEMS,
    )
    min_unique: int | None = filter_option(
        None,
        dataset=True,
        label="Min unique achievements",
        help=f"Episodes that unlocked at least this many of the {len(ACHIEVEMENTS)}.",
        flag="min-unique",
        metavar="N",
        minimum=0,
        maximum=len(ACHIEVEMENTS),
    )
    min_reward: float | None = filter_option(
        None,
        dataset=True,
        label="Min episode reward",
        help="Episodes whose total reward is at least this.",
        flag="min-reward",
        metavar="X",
    )
    # Per turn: the turn itself unlocked each of these; its own reward's sign.
    turn_unlocked: tuple[str, ...] = filter_option(
        (), query="achievement", query_label="Unlocked", **_ACHIEVEMENT_ITEMS
    )
    reward: str = filter_option(
        "any",
        query="reward",
        choices=REWARD_CHOICES,
        choice_labels=(("positive", "> 0"), ("zero", "= 0"), ("negative", "< 0")),
    )
    # Model text, note or observation text contains this, case-insensitive.
    search: str = filter_option(
        "",
        query="q",
        query_label="Search",
        query_help="Model text, notes and observation text.",
        max_length=200,
    )
    user_image: bool = filter_option(
        False,
        dataset=True,
        label="User image present",
        help="Rows whose user message shows an image (text-only observation mode has none).",
        flag="user-image",
        flag_help="rows with a user image",
    )
    include_assistant: bool = filter_option(
        False,
        dataset=True,
        label="Assistant image present",
        help="Only rows whose assistant messages hold an image: studio turns never "
        "have one (only some imported rows do), so this usually selects nothing.",
        flag="include-assistant",
        flag_help="rows whose assistant messages hold an image as well (synth-ai's flag)",
    )
    flagged: str = filter_option(
        "any",
        dataset=True,
        required=True,
        help="Turns flagged in review.",
        flag="flagged",
        query="flagged",
        choices=FLAGGED_CHOICES,
        choice_labels=tuple(FLAGGED_LABELS.items()),
    )
    # Two error filters of their own: `has_error` is the turn list's (the error message),
    # `exclude_errors` a dataset's (neither an error message nor an error kind).
    has_error: str = filter_option(
        "any",
        query="has_error",
        query_label="Error",
        choices=ERROR_CHOICES,
        choice_labels=(("yes", "with error"), ("no", "without error")),
    )
    exclude_errors: bool = filter_option(
        False,
        dataset=True,
        label="Exclude turns with errors",
        help="Leave out turns whose model call failed or whose answer was unusable.",
        flag="exclude-errors",
        flag_help="leave out turns whose model call failed or whose answer was unusable",
    )
    # Turns whose actions were read from the model's prose (Turn.text_fallback) carry a tool
    # call the model never made: left out unless asked for, then marked in the metadata.
    include_text_fallback: bool = filter_option(
        False,
        dataset=True,
        label="Include text-fallback turns",
        help="Turns where the model answered in prose and its actions were read from "
        "the text. Left out by default (the model made no tool call); included, they are "
        "marked metadata.text_fallback. Studio format only.",
        flag="include-text-fallback",
        flag_help="also turns whose actions were read from the model's prose (left out by "
        "default: the model made no tool call); marked metadata.text_fallback",
    )
    # Human in the loop: turns a reviewer corrected, and the replayed prefix of forks (the
    # original's turns again: left out unless asked for).
    relabeled: str = filter_option(
        "any",
        dataset=True,
        label="Relabeled turns",
        help="Turns a reviewer corrected export the correction as the tool call.",
        flag="relabeled",
        flag_help="turns a reviewer corrected: any (default), only them, or none of them",
        choices=RELABELED_CHOICES,
        choice_labels=(("only", "relabeled only"), ("exclude", "exclude relabeled")),
    )
    include_fork_prefix: bool = filter_option(
        False,
        dataset=True,
        label="Include forks' replayed turns",
        help="A fork's turns before the fork point repeat its original; left out by default.",
        flag="include-fork-prefix",
        flag_help="also export the turns a fork replays from its original",
    )
    # An episode its batch's Cancel stopped is kept and reviewable (the turn list shows it,
    # marked), but it ended where nobody chose: datasets leave it out unless asked for.
    include_canceled: bool = filter_option(
        False,
        dataset=True,
        label="Include canceled episodes",
        help="Turns of episodes stopped by their batch's Cancel; left out by default.",
        flag="include-canceled",
        flag_help="also export the turns of episodes stopped by their batch's Cancel (left "
        "out by default)",
        omitted_at_default=True,
    )
    # best-of-N over the samples of each seed (see `kept_episodes`)
    top_per_seed: int | None = filter_option(
        None,
        dataset=True,
        label="Top n episodes per seed",
        help="Best-of-N: by unique achievements, then reward (ties: earlier sample).",
        flag="top-per-seed",
        flag_help="best-of-N: the N best episodes of each seed (unique achievements, then reward)",
        metavar="N",
        minimum=1,
        maximum=1000,
    )
    at_or_above_mean: bool = filter_option(
        False,
        dataset=True,
        label="At or above the seed's mean",
        help="Episodes whose reward is at least the mean of their seed's samples.",
        flag="at-or-above-mean",
        flag_help="episodes whose reward is at least the mean of their seed's samples",
    )
    # Picked by hand on the turn list: these turns (and what else the selection says). A bulk
    # flag, a note or "add to dataset" of the ticked rows is a selection of them.
    turn_ids: tuple[int, ...] = filter_option(
        (),
        word="turns",
        item="turn",
        minimum=1,
        maximum=BIGINT_MAX,
        bounds_message=f"turn ids are integers from 1 to {BIGINT_MAX}",
        max_items=TURN_IDS_MAX,
        omitted_at_default=True,
    )
    # A dataset's include list: these turns are kept whatever the other filters say (an OR
    # in `turns_selected`); appended to from the turn list (`curation.services`).
    include_turns: tuple[int, ...] = filter_option(
        (),
        word="included turns",
        item="turn",
        minimum=1,
        maximum=BIGINT_MAX,
        bounds_message=f"turn ids are integers from 1 to {BIGINT_MAX}",
        max_items=INCLUDE_TURNS_MAX,
        omitted_at_default=True,
    )

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        for f, spec in turn_filters():
            problem = _problem(f.name, spec, getattr(self, f.name))
            if problem:
                raise FilterError(f"{filter_word(f.name)}: {problem}")
        both = set(self.require_achievements) & set(self.exclude_achievements)
        if both:
            raise FilterError(
                f"achievement {sorted(both)[0]!r} is both required and excluded: nothing matches"
            )

    def to_json(self) -> dict[str, Any]:
        data = options_to_json(self)
        for f, spec in turn_filters():
            if spec.omitted_at_default and getattr(self, f.name) == f.default:
                del data[f.name]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> TurnSelection:
        return options_from_json(cls, data or {})


def turn_filters() -> list[tuple[dataclasses.Field, Filter]]:
    """The fields of TurnSelection with their Filter, in declaration order."""
    return [(f, f.metadata["filter"]) for f in dataclasses.fields(TurnSelection)]


def filter_of(name: str) -> Filter:
    return TurnSelection.__dataclass_fields__[name].metadata["filter"]


@functools.cache
def option_types(cls: type) -> dict[str, tuple[type, bool, bool]]:
    """Each field of an options dataclass as (its value type, an item's for a tuple; whether
    it is a tuple; whether it may be None): batches (int, True, False), min_reward
    (float, False, True), flagged (str, False, False)."""
    types = {}
    for name, hint in typing.get_type_hints(cls).items():
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        kinds = [a for a in args if a is not type(None)]
        many = typing.get_origin(hint) is tuple
        types[name] = (kinds[0] if kinds else hint, many, len(kinds) < len(args))
    return types


def filter_kind(name: str) -> tuple[type, bool]:
    """The filter's value type (an item's, for a tuple) and whether it is a tuple."""
    kind, many, _optional = option_types(TurnSelection)[name]
    return kind, many


def filter_word(name: str) -> str:
    """How one-line messages and summaries name a filter: its flag, else the turn list's
    label (`unlocked`, `error`), else its field name."""
    spec = filter_of(name)
    if spec.flag:
        return spec.flag
    if spec.query:
        return (spec.query_label or spec.query).lower()
    return spec.word or name.replace("_", "-")


def _problem(name: str, spec: Filter, value: Any) -> str:
    """What is wrong with a filter's value against its declaration, or ""."""
    kind, many = filter_kind(name)
    values = value if many else (() if value is None else (value,))
    if spec.max_items is not None and len(values) > spec.max_items:
        return f"at most {spec.max_items:,} {spec.item}s, not {len(values):,}"
    if spec.choices:
        unknown = [v for v in values if v not in spec.choices]
        if unknown and many:
            # synth-ai's exporter matched nothing here without a word; this is an error.
            return f"unknown {spec.item} {unknown[0]!r}; valid: {', '.join(spec.choices)}"
        if unknown:
            return f"{unknown[0]!r} is not one of {', '.join(spec.choices)}"
    if kind is float and any(not math.isfinite(v) for v in values):
        return "not a finite number"
    if spec.minimum is not None and spec.maximum is not None:
        outside = [v for v in values if not spec.minimum <= v <= spec.maximum]
        if outside:
            return (
                spec.bounds_message
                or f"{outside[0]} is not between {spec.minimum} and {spec.maximum}"
            )
    return ""


def filter_text(name: str, value: Any) -> str:
    """A filter's value as the pages show it: choices in their words, lists joined."""
    spec = filter_of(name)
    values = value if isinstance(value, tuple) else (value,)
    shown = [
        ("yes" if v else "no") if isinstance(v, bool) else spec.choice_label(str(v)) for v in values
    ]
    if spec.max_items is not None and len(shown) > SHOWN_ITEMS:
        # Ids picked by hand run to thousands: the first few, and how many.
        return ", ".join(shown[:SHOWN_ITEMS]) + f", … ({len(shown):,} {spec.item}s)"
    return ", ".join(shown)


def selection_summary(
    selection: TurnSelection, *, base: TurnSelection | None = None
) -> list[tuple[str, str]]:
    """Every filter of the selection that narrows `base` (by default, the turn list's
    `EVERY_TURN`), as (its word, its value shown): nothing for a filter left as it is."""
    base = EVERY_TURN if base is None else base
    return [
        (filter_word(f.name), filter_text(f.name, getattr(selection, f.name)))
        for f, _spec in turn_filters()
        if getattr(selection, f.name) != getattr(base, f.name)
    ]


# The turn list's starting point: every turn, whatever the dataset defaults leave out.
EVERY_TURN = TurnSelection(
    include_text_fallback=True, include_fork_prefix=True, include_canceled=True
)


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
    types = option_types(cls)
    values: dict[str, Any] = {}
    for name, value in data.items():
        kind, many, optional = types[name]
        try:
            if many:
                if isinstance(value, str | int):
                    value = [value]
                values[name] = tuple(kind(v) for v in value)
            elif kind is bool:
                values[name] = bool(value)
            elif kind in (int, float):
                # Empty: None where the field may be None, else its default.
                empty = None if optional else fields[name].default
                values[name] = empty if value in (None, "") else kind(value)
            else:
                values[name] = value
        except (TypeError, ValueError) as exc:
            raise FilterError(f"{name}: {value!r} is not valid ({exc})") from exc
    return cls(**values)
