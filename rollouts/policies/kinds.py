"""Policy kinds, each declared once: what every form, command, page and selector asks of one.

A kind is declared (`register(PolicyKind(...))`) in the module that implements it; the
modules of the built-in kinds are listed in `KIND_MODULES` and imported the first time the
registry is read, so a form, the `rollout` command or a page never names a policy itself:

* the batch form's and the fork form's choices, `rollout --policy`'s choices and help
  (`offered`);
* which options a kind's page shows and validates (`options`): the fields marked for it on the
  page, the endpoint picked for it, "needs a model" when `model` is among them;
* whether its turns are model calls (`calls_model`): the live counters, the spend estimate
  and columns, the model queue, the cancel check before each request;
* the stored `RolloutBatch.policy` choices (`policy_choices`, a callable: a new kind needs no
  migration).

See docs/layout.md, "How to add a policy".
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollouts.policies.base import Policy

# A batch's `rollouts.rollout_settings.RolloutSettings`: not imported, since that module asks
# this one its policies.
RolloutSettings = Any

# The modules that declare the built-in kinds, in the order their choices show.
KIND_MODULES = (
    "rollouts.policies.baselines",
    "rollouts.policies.openai",
    "rollouts.policies.imported",
    "rollouts.policies.trained",
    "rollouts.play",
)

# `RolloutBatch.policy` holds the name.
NAME_MAX_LENGTH = 20

# (settings, seed=, sample=, cli_api_key=) -> a policy that plays one episode.
PolicyFactory = Callable[..., "Policy"]


@dataclass(frozen=True)
class KindOption:
    """An option only one kind has: a `rollout` flag, a field of the batch form and a row of
    the batch page, kept in the settings' `extra` (no field of `RolloutSettings`).

    Its type is its default's (int, float or str)."""

    name: str
    default: int | float | str
    help: str = ""
    label: str = ""  # the form's label and the batch page's row; empty: from the name
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def title(self) -> str:
        return self.label or self.name.replace("_", " ").capitalize()

    def problem(self, value: Any) -> str:
        """What is wrong with the value, or ""."""
        if not isinstance(value, type(self.default)) or isinstance(value, bool):
            return f"{value!r} is not a {type(self.default).__name__}"
        if self.choices and value not in self.choices:
            return f"{value!r} is not one of {', '.join(self.choices)}"
        low, high = self.minimum, self.maximum
        if (low is not None and value < low) or (high is not None and value > high):
            return f"{value} is not between {low} and {high}"
        return ""


@dataclass(frozen=True)
class PolicyKind:
    """One kind of policy.

    `options`: the `RolloutSettings` fields only this kind uses (shown on the page for it, and
    `endpoint` picked and checked for it). `factory`: None for a kind no worker plays (a
    person's game in the browser, an import). `images_per_call`: images one model call sends,
    for the spend estimate of a batch that has not run yet."""

    name: str
    factory: PolicyFactory | None = None
    label: str = ""  # the choice's words on the pages; empty: the name
    help: str = ""  # what it does, e.g. "openai asks a model" (`rollout --help`, the form)
    calls_model: bool = False
    page_help: str = ""  # the same words for the page; empty: `help`
    offered: bool = True  # picked on the batch form and by `rollout --policy`
    # Its games are played here, by a worker or a person (valid batch settings); False for a
    # kind only an import writes.
    plays: bool = True
    options: tuple[str, ...] = ()
    images_per_call: Callable[[RolloutSettings], int] | None = None
    own_options: tuple[KindOption, ...] = ()

    @property
    def choice_label(self) -> str:
        return self.label or self.name

    @property
    def played_by_worker(self) -> bool:
        return self.factory is not None

    @property
    def needs_endpoint(self) -> bool:
        """Its calls go to an endpoint an admin named (the form and the command pick one)."""
        return "endpoint" in self.options

    @property
    def needs_model(self) -> bool:
        return "model" in self.options

    @property
    def shows_history(self) -> bool:
        """Its prompts carry the last turns' frames (`history_frames`)."""
        return "history_frames" in self.options


_kinds: dict[str, PolicyKind] = {}
_declared_in: dict[str, str] = {}
_loaded = False
_lock = threading.RLock()


def register(kind: PolicyKind) -> PolicyKind:
    """Declare a kind; a second declaration of a name replaces the first (a module reloaded)."""
    if not 0 < len(kind.name) <= NAME_MAX_LENGTH:
        raise ValueError(f"a policy kind's name is 1 to {NAME_MAX_LENGTH} characters")
    # The declaring module orders the kinds (`KIND_MODULES`), whichever is imported first.
    module = sys._getframe(1).f_globals.get("__name__", "")
    with _lock:
        _kinds[kind.name] = kind
        _declared_in[kind.name] = module
    return kind


def unregister(name: str) -> None:
    """Forget a kind (a test's throwaway one)."""
    with _lock:
        _kinds.pop(name, None)
        _declared_in.pop(name, None)


def _load() -> None:
    global _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        for module in KIND_MODULES:
            importlib.import_module(module)
        _loaded = True


def policy_kinds() -> list[PolicyKind]:
    """Every kind: the built-in ones in `KIND_MODULES`' order, then others as declared."""
    _load()
    with _lock:
        kinds = list(_kinds.values())
        rank = {name: _module_rank(_declared_in[name]) for name in _kinds}
    return sorted(kinds, key=lambda kind: rank[kind.name])  # a stable sort keeps the rest


def _module_rank(module: str) -> int:
    return KIND_MODULES.index(module) if module in KIND_MODULES else len(KIND_MODULES)


def policy_kind(name: str) -> PolicyKind:
    """The kind of that name; KeyError for none."""
    _load()
    return _kinds[name]


def policy_kind_or_none(name: str) -> PolicyKind | None:
    _load()
    return _kinds.get(name)


def offered_names() -> tuple[str, ...]:
    """The kinds people pick (batch form, fork form, `rollout --policy`)."""
    return tuple(k.name for k in policy_kinds() if k.offered)


def model_policy_names() -> tuple[str, ...]:
    """The kinds whose turns are model calls, for queries (`policy__in=`)."""
    return tuple(k.name for k in policy_kinds() if k.calls_model)


def calls_model(name: str) -> bool:
    kind = policy_kind_or_none(name)
    return kind is not None and kind.calls_model


def policy_choices() -> list[tuple[str, str]]:
    """`RolloutBatch.policy`'s choices: every kind, internal ones too. A callable, so that the
    migration records this function and a new kind changes no migration."""
    return [(k.name, k.name) for k in policy_kinds()]


def policies_help() -> str:
    """`rollout --policy`'s help: each offered kind's own words."""
    return "; ".join(k.help or k.name for k in policy_kinds() if k.offered)


def policies_page_help() -> str:
    """The batch form's help of the policy field."""
    return "; ".join(k.page_help or k.help or k.name for k in policy_kinds() if k.offered) + "."


def offered_choices() -> list[tuple[str, str]]:
    """The policy field's choices on the batch form (a callable: read as the form renders)."""
    return [(k.name, k.choice_label) for k in policy_kinds() if k.offered]


def offered_list() -> str:
    """`scripted, random or openai`: the offered kinds in a sentence."""
    names = offered_names()
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def kinds_using(option: str) -> str:
    """The offered kinds that use `option`, space-separated (the page's data-policies)."""
    return " ".join(k.name for k in policy_kinds() if k.offered and option in k.options)


def build_policy(
    settings: RolloutSettings, *, seed: int, sample: int = 0, cli_api_key: str = ""
) -> Policy:
    """The policy that plays one episode of a batch with these settings."""
    kind = policy_kind_or_none(settings.policy)
    if kind is None or kind.factory is None:
        raise ValueError(f"unknown policy {settings.policy!r}")
    return kind.factory(settings, seed=seed, sample=sample, cli_api_key=cli_api_key)


def own_options() -> list[tuple[PolicyKind, KindOption]]:
    """The kind-own options of the kinds people pick, each name once (the first kind's)."""
    seen: set[str] = set()
    found = []
    for kind in policy_kinds():
        for option in kind.own_options if kind.offered else ():
            if option.name not in seen:
                seen.add(option.name)
                found.append((kind, option))
    return found


def own_values(kind: PolicyKind, given: dict[str, Any]) -> dict[str, Any]:
    """The settings' `extra` of a batch of `kind`: each of its own options, given or default."""
    return {
        o.name: o.default if given.get(o.name) in (None, "") else given[o.name]
        for o in kind.own_options
    }


def images_per_call(settings: RolloutSettings) -> int:
    kind = policy_kind(settings.policy)
    return kind.images_per_call(settings) if kind.images_per_call else 1


__all__ = [
    "KIND_MODULES",
    "KindOption",
    "PolicyKind",
    "build_policy",
    "calls_model",
    "kinds_using",
    "model_policy_names",
    "offered_choices",
    "offered_list",
    "offered_names",
    "own_options",
    "own_values",
    "policies_help",
    "policies_page_help",
    "policy_choices",
    "policy_kind",
    "policy_kind_or_none",
    "policy_kinds",
    "register",
    "unregister",
]
