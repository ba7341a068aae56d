"""The options of a rollout batch, declared once: the command, the task, the forms and the JSON.

Each field of `RolloutSettings` carries an `Option` (its help, bounds, choices, and how it shows
on the page); `add_cli_arguments` makes the `rollout` command's flags from them and
`rollouts.forms_settings.settings_form_field` the page's fields, so a default, a bound or a
choice is written in one place and cannot differ between the command line and the page.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import typing
from dataclasses import dataclass, field
from typing import Any

from rollouts.game.crafter_env import ACTIONS
from rollouts.policies import kinds

# `human` games are played in the browser (rollouts.play.services), never by a worker. The
# other kinds, and which of them people pick, are declared in `rollouts.policies.kinds`.
HUMAN_POLICY = "human"
DEFAULT_SCRIPT = ("move_right", "move_down", "move_left", "move_up", "do")
OBSERVATION_MODES = ("image_text", "image", "text")
IMAGE_DETAILS = ("auto", "low", "high")
ON_BAD_OUTPUT = ("noop", "end")
MAX_SEEDS = 10_000
MAX_SAMPLES_PER_SEED = 64
MAX_EPISODES = 10_000
MAX_STEPS = 10_000
MAX_SEED = 2**31 - 2
# Tried with crafter 1.8.3: at 17 px and less every reset() raises "height and width must be
# > 0" (a cell of the 9x9 grid is then too small for its item textures); 18 to 1024 render.
MIN_IMAGE_SIZE = 18
MAX_IMAGE_SIZE = 1024
_SEED_PART = re.compile(r"^(\d+)(?:-(\d+))?$")


class SettingsError(ValueError):
    """A rollout option is invalid; the message says which and why, in one line."""


def parse_seeds(spec: str) -> list[int]:
    """`7`, `0-9` or `1,5,9-12` -> sorted unique seeds."""
    seeds: set[int] = set()
    text = str(spec).strip()
    if not text:
        raise SettingsError("seeds: empty; use a form like 7, 0-9 or 1,5,9-12")
    for part in text.split(","):
        match = _SEED_PART.match(part.strip())
        if not match:
            raise SettingsError(f"seeds: {part.strip()!r} is not a seed or a range like 0-9")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low:
            raise SettingsError(f"seeds: range {part.strip()!r} ends before it starts")
        if high - low + 1 + len(seeds) > MAX_SEEDS:
            raise SettingsError(f"seeds: more than {MAX_SEEDS} seeds in one batch")
        seeds.update(range(low, high + 1))
    return sorted(seeds)


def seeds_spec(seeds: list[int] | tuple[int, ...]) -> str:
    """The inverse of `parse_seeds`: [0, 1, 2, 3, 7] -> `0-3,7`."""
    parts: list[str] = []
    ordered = sorted(set(seeds))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


@dataclass(frozen=True)
class Option:
    """How one option shows on each face: the command's flag and the page's field.

    Bounds are checked by `RolloutSettings.problems()`, and so with the same words whether the
    value came from a flag, a form or stored JSON.
    """

    help: str = ""  # the command's --help
    page_help: str = ""  # the form's help text
    label: str = ""  # the form's label; empty: Django's, from the field name
    choices: tuple[str, ...] = ()
    # Choices and help are those of the policy kinds people pick (`rollouts.policies.kinds`),
    # read when a form or the command is made, so a kind declared later shows too.
    from_kinds: bool = False
    choice_labels: tuple[tuple[str, str], ...] = ()  # the page's words for some choices
    minimum: int | None = None  # bounds, the same for an int or a float option
    maximum: int | None = None
    above_minimum: bool = False  # the minimum itself is refused: (minimum, maximum]
    bounds_note: str = ""  # said after "... is not between A and B"
    bounds_message: str = ""  # said instead of it
    cli: bool = True  # a flag of `rollout`
    metavar: str | None = None
    # A field of the batch form made from this declaration (`rollouts.forms`). The endpoint is
    # a choice among the named ones there, made by the form itself; the URL is never typed.
    form: bool = True
    page_optional: bool = False  # the page may send it empty: the default applies
    # Not given (None on the command line, empty on the page): the endpoint's own default,
    # else the field's default.
    endpoint_default: bool = False
    # The resolved endpoint's name or URL (`rollout`'s --endpoint/--base-url lookup).
    from_endpoint: bool = False
    max_length: int | None = None

    def bounds_problem(self, value: float) -> str:
        """What is wrong with the value, or "" when it is within the bounds."""
        low, high = self.minimum, self.maximum
        if low is None:
            return ""
        low_ok = value > low if self.above_minimum else value >= low
        if low_ok and (high is None or value <= high):
            return ""
        if self.bounds_message:
            return self.bounds_message
        if self.above_minimum:
            return f"{value} is not in ({low}, {high}]"
        return f"{value} is not between {low} and {high}{self.bounds_note}"


def option(default: Any = dataclasses.MISSING, **meta: Any) -> Any:
    """A field of RolloutSettings with its Option. Which policies use it (the page shows it
    for those only) is said by each kind's `options` (`rollouts.policies.kinds`)."""
    return field(default=default, metadata={"option": Option(**meta)})


@dataclass(frozen=True)
class RolloutSettings:
    policy: str = option(from_kinds=True)
    seeds: tuple[int, ...] = option(
        (0,), help="7, 0-9 or 1,5,9-12", page_help="7, 0-9 or 1,5,9-12; one episode each."
    )
    # K episodes of each seed (best-of-N, preference pairs); sample i seeds the policy's sampling
    samples_per_seed: int = option(
        1,
        minimum=1,
        maximum=MAX_SAMPLES_PER_SEED,
        metavar="K",
        help="play each seed K times (sample i seeds the policy's own sampling)",
        label="Samples per seed",
        page_help="Play each seed K times (best-of-N, preference pairs).",
        page_optional=True,
    )
    steps: int = option(
        256,
        minimum=1,
        maximum=MAX_STEPS,
        help="step limit of each episode",
        page_help="Step limit of each episode.",
    )
    image_size: int = option(
        64,
        minimum=MIN_IMAGE_SIZE,
        maximum=MAX_IMAGE_SIZE,
        bounds_note=f" (crafter draws nothing below {MIN_IMAGE_SIZE} px)",
        help="frame width and height in pixels",
        label="Image size (px)",
    )
    actions: tuple[str, ...] = option(
        DEFAULT_SCRIPT,
        help="the scripted policy's actions, cycled",
        page_help="Action names separated by spaces, cycled.",
    )
    name: str = option("", help="a name for the batch", max_length=200, page_optional=True)
    # openai policy
    model: str = option(
        "",
        help="model name (openai policy)",
        page_help="Model name, e.g. gpt-4o-mini.",
        max_length=200,
    )
    # An admin-named endpoint (`studio.models.Endpoint`) and its base URL when the batch was
    # created; without a name, a URL given on the command line.
    endpoint: str = option(
        "",
        help="an endpoint an admin named (its URL, key variable and limits); "
        "default: 'default' when it exists",
        form=False,
        from_endpoint=True,
    )
    base_url: str = option(
        "",
        help="an OpenAI-compatible URL instead of --endpoint; workers send no key to a URL "
        "no endpoint has, --inline sends this command's OPENAI_API_KEY",
        form=False,
        from_endpoint=True,
    )
    history_frames: int = option(
        0,
        minimum=0,
        maximum=9,
        help="also show the last K frames (0-9)",
        label="History frames",
        page_help="Also show the last K turns' frames (0-9).",
    )
    concurrency: int = option(
        4,
        minimum=1,
        maximum=256,
        help="most model requests in flight per endpoint, across all workers "
        "(default: the endpoint's, else 4)",
        page_help="Most requests in flight to the endpoint, across all workers; "
        "empty: the endpoint's default.",
        endpoint_default=True,
    )
    temperature: float = option(0.0, minimum=0, maximum=2, help="0 to 2", page_help="0 to 2.")
    max_tokens: int = option(
        512,
        minimum=1,
        maximum=32_768,
        help="most tokens of one answer",
        label="Max tokens",
    )
    image_detail: str = option(
        "auto",
        choices=IMAGE_DETAILS,
        help="the image_url detail sent with each frame",
        page_help="low costs 85 tokens an image.",
    )
    observation_mode: str = option(
        "image_text",
        choices=OBSERVATION_MODES,
        choice_labels=(
            ("image_text", "image and text"),
            ("image", "image only"),
            ("text", "text only"),
        ),
        help="what the model is shown each turn",
        label="Observation",
        page_help="What the model is shown each turn.",
    )
    on_bad_output: str = option(
        "noop",
        choices=ON_BAD_OUTPUT,
        choice_labels=(("noop", "play noop and go on"), ("end", "end the episode")),
        help="after a failed call or unusable answer: play noop, or end the episode",
        label="On bad output",
        page_help="After a failed call or an unusable answer.",
    )
    max_retries: int = option(
        4,
        minimum=0,
        maximum=20,
        help="retries of a 429, 5xx, timeout or drop",
        label="Retries",
        page_help="Of a 429, 5xx, timeout or dropped connection (0-20).",
    )
    request_timeout: float = option(
        60.0,
        minimum=0,
        maximum=600,
        above_minimum=True,
        help="seconds one model request may take (up to 600)",
        label="Request timeout (s)",
        page_help="Up to 600.",
    )
    requests_per_minute: int = option(
        0,
        minimum=0,
        bounds_message="must be 0 (no limit) or more",
        help="per endpoint, across all workers; 0 = no limit (default: the endpoint's)",
        label="Requests per minute",
        page_help="Per endpoint, across all workers; 0 = no limit; empty: the endpoint's.",
        endpoint_default=True,
    )
    extra: dict[str, Any] = field(
        default_factory=dict, metadata={"option": Option(cli=False, form=False)}
    )

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def unchecked(cls, **values: Any) -> RolloutSettings:
        """An instance without validation, to list all its `problems()` (forms)."""
        instance = object.__new__(cls)
        for f in dataclasses.fields(cls):
            if f.name in values:
                value = values[f.name]
            elif f.default is not dataclasses.MISSING:
                value = f.default
            else:
                value = f.default_factory()  # type: ignore[misc]
            object.__setattr__(instance, f.name, value)
        return instance

    def validate(self) -> None:
        problems = self.problems()
        if problems:
            field_name, message = problems[0]
            raise SettingsError(f"{field_name.replace('_', '-')}: {message}")

    def problems(self) -> list[tuple[str, str]]:
        """Every invalid option as (field name, what is wrong), for a form to show at once."""
        found: list[tuple[str, str]] = []

        def check(ok: bool, field_name: str, message: str) -> None:
            if not ok:
                found.append((field_name, message))

        for f in dataclasses.fields(self):
            spec: Option = f.metadata["option"]
            value = getattr(self, f.name)
            if spec.from_kinds:
                # `human` too: no face offers it, a game in the browser is made with it.
                kind = kinds.policy_kind_or_none(value)
                check(
                    kind is not None and kind.plays,
                    "policy",
                    f"{value!r} is not one of {', '.join(kinds.offered_names())}",
                )
            elif spec.choices:
                check(value in spec.choices, f.name, f"{value!r} is not one of {spec.choices}")
            if spec.minimum is not None:
                problem = spec.bounds_problem(value)
                check(not problem, f.name, problem)
            if f.name == "seeds":
                check(bool(self.seeds), "seeds", "at least one seed is needed")
                check(
                    all(0 <= s <= MAX_SEED for s in self.seeds),
                    "seeds",
                    f"each seed must be between 0 and {MAX_SEED}",
                )
            elif f.name == "samples_per_seed":
                check(
                    len(self.seeds) * self.samples_per_seed <= MAX_EPISODES,
                    "samples_per_seed",
                    f"{len(self.seeds)} seeds x {self.samples_per_seed} samples is more than "
                    f"{MAX_EPISODES} episodes in one batch",
                )
            elif f.name == "actions":
                check(bool(self.actions), "actions", "at least one action is needed")
                unknown = [a for a in self.actions if a not in ACTIONS]
                if unknown:
                    known = ", ".join(ACTIONS)
                    check(False, "actions", f"unknown action {unknown[0]!r}; known: {known}")
        kind = kinds.policy_kind_or_none(self.policy)
        check(
            kind is None or not kind.needs_model or bool(self.model),
            "model",
            f"the {self.policy} policy needs --model",
        )
        for own in kind.own_options if kind is not None else ():
            problem = own.problem(self.extra.get(own.name, own.default))
            check(not problem, own.name, problem)
        return found

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["seeds"] = list(self.seeds)
        data["actions"] = list(self.actions)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RolloutSettings:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for key in ("seeds", "actions"):
            if key in values:
                values[key] = tuple(values[key])
        return cls(**values)


def options() -> list[tuple[dataclasses.Field, Option]]:
    """The fields of RolloutSettings with their Option, in declaration order."""
    return [(f, f.metadata["option"]) for f in dataclasses.fields(RolloutSettings)]


def option_of(name: str) -> Option:
    return RolloutSettings.__dataclass_fields__[name].metadata["option"]


def default_of(name: str) -> Any:
    """The field's default; MISSING for `policy`, which has none."""
    f = RolloutSettings.__dataclass_fields__[name]
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


_HINTS = typing.get_type_hints(RolloutSettings)


def kind_of(name: str) -> Any:
    """The field's type: int, float, str, or tuple[int, ...] (seeds) / tuple[str, ...]."""
    return _HINTS[name]


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def cli_default(name: str) -> Any:
    """What `rollout` has when the flag is not given: the field's default, in the flag's form.

    None for `--policy` (required) and for the limits an endpoint sets (`endpoint_default`).
    """
    default = default_of(name)
    if default is dataclasses.MISSING or option_of(name).endpoint_default:
        return None
    if kind_of(name) == tuple[int, ...]:
        return seeds_spec(default)
    if kind_of(name) == tuple[str, ...]:
        return list(default)
    return default


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """A flag for each option of a batch: `rollout` (and `fork_episode`, which takes its)."""
    for f, spec in options():
        if not spec.cli:
            continue
        kwargs: dict[str, Any] = {"default": cli_default(f.name)}
        kind = kind_of(f.name)
        if spec.from_kinds:
            kwargs["choices"] = kinds.offered_names()
            kwargs["help"] = kinds.policies_help()
        elif spec.choices:
            kwargs["choices"] = spec.choices
        elif kind in (int, float):
            kwargs["type"] = kind
        elif kind == tuple[str, ...]:
            kwargs["nargs"] = "+"
        if spec.help:
            kwargs["help"] = spec.help
        if spec.metavar:
            kwargs["metavar"] = spec.metavar
        parser.add_argument(flag_of(f.name), **kwargs)
    for kind, own in kinds.own_options():
        parser.add_argument(
            own.flag,
            type=type(own.default),
            choices=own.choices or None,
            default=None,
            help=f"{own.help} ({kind.name} policy; default {own.default})",
        )


def settings_from_cli(
    cli_options: dict[str, Any], *, endpoint: dict[str, Any] | None = None
) -> RolloutSettings:
    """The settings the flags give. `endpoint`: the resolved endpoint's name, URL and limits
    (`rollouts.policies.endpoints.endpoint_settings`), or {"base_url": URL} for an unnamed one.
    Raises SettingsError naming the flag."""
    endpoint = endpoint or {}
    values: dict[str, Any] = {}
    for f, spec in options():
        if not spec.cli:
            continue
        value = cli_options[f.name]
        if spec.from_endpoint or (value is None and spec.endpoint_default):
            value = endpoint.get(f.name, default_of(f.name))
        elif kind_of(f.name) == tuple[int, ...]:
            value = tuple(parse_seeds(value))
        elif kind_of(f.name) == tuple[str, ...]:
            value = tuple(value)
        values[f.name] = value
    kind = kinds.policy_kind_or_none(values.get("policy") or "")
    if kind is not None and kind.own_options:
        values["extra"] = kinds.own_values(kind, cli_options)
    return RolloutSettings(**values)
