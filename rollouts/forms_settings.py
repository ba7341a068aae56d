"""The page's face of RolloutSettings: a form field for each option, made from its declaration.

The `rollout` command's flags come from the same declaration (`add_cli_arguments`), so the
default, bounds, choices and out-of-bounds message of an option are the same on both faces.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.utils.functional import lazy

from rollouts.policies import kinds
from rollouts.rollout_settings import (
    Option,
    default_of,
    kind_of,
    option_of,
    parse_seeds,
    seeds_spec,
)


def page_message(message: str) -> str:
    """RolloutSettings words its problems for the command line; the page names no flags."""
    message = message.replace("needs --model", "needs a model name")
    return message[:1].upper() + message[1:] + ("" if message.endswith(".") else ".")


def page_value(name: str, value: Any) -> Any:
    """A settings value as the page shows it: seeds as `0-3,7`, actions separated by spaces."""
    if kind_of(name) == tuple[int, ...]:
        return seeds_spec(value)
    if kind_of(name) == tuple[str, ...]:
        return " ".join(value)
    return value


def settings_value(name: str, value: Any) -> Any:
    """What the page sent, as a settings value; raises SettingsError for bad seeds."""
    if kind_of(name) == tuple[int, ...]:
        return tuple(parse_seeds(value))
    if kind_of(name) == tuple[str, ...]:
        return tuple(str(value).split())
    return value


def _bounds_validator(spec: Option):
    def within_bounds(value: float) -> None:
        problem = spec.bounds_problem(value)
        if problem:
            raise ValidationError(page_message(problem), code="bounds")

    return within_bounds


def settings_form_field(name: str, **overrides: Any) -> forms.Field:
    """The form field of one option: initial value (its default), bounds, choices, label and
    help from RolloutSettings. `overrides`: Field arguments a page changes (initial, help)."""
    spec = option_of(name)
    kind = kind_of(name)
    default = default_of(name)
    kwargs: dict[str, Any] = {
        "initial": None
        if default is dataclasses.MISSING or spec.endpoint_default
        else page_value(name, default),
        # Fields of one policy are hidden and not sent for the others: the default applies.
        "required": not (spec.page_optional or kinds.kinds_using(name)),
    }
    if spec.label:
        kwargs["label"] = spec.label
    if spec.page_help:
        kwargs["help_text"] = spec.page_help
    if spec.from_kinds:
        kwargs["help_text"] = lazy(kinds.policies_page_help, str)()
    kwargs.update(overrides)
    field: forms.Field
    if spec.from_kinds:
        field = forms.ChoiceField(choices=kinds.offered_choices, **kwargs)
    elif spec.choices:
        labels = dict(spec.choice_labels)
        field = forms.ChoiceField(choices=[(c, labels.get(c, c)) for c in spec.choices], **kwargs)
    elif kind in (int, float):
        field = (forms.IntegerField if kind is int else forms.FloatField)(**kwargs)
        # The browser's hints; the check and its words are the declaration's.
        if spec.minimum is not None and not spec.above_minimum:
            field.widget.attrs["min"] = spec.minimum
        if spec.maximum is not None:
            field.widget.attrs["max"] = spec.maximum
        if spec.minimum is not None:
            field.validators.append(_bounds_validator(spec))
    else:
        field = forms.CharField(max_length=spec.max_length, **kwargs)
    if kinds.kinds_using(name):
        # data-policies on the page: read as it renders, so a kind declared later shows too.
        field.policies = policies_using(name)  # type: ignore[attr-defined]
    return field


def policies_using(option: str) -> str:
    """The policies that use `option`, space-separated, read when the page renders."""
    return lazy(kinds.kinds_using, str)(option)


def own_option_field(option: kinds.KindOption, *, policy: str) -> forms.Field:
    """The batch form's field of a kind-own option, shown for its kind only."""
    kwargs: dict[str, Any] = {
        "required": False,  # empty: the default applies
        "initial": option.default,
        "label": option.title,
        "help_text": option.help,
    }
    field: forms.Field
    if option.choices:
        field = forms.ChoiceField(choices=[(c, c) for c in option.choices], **kwargs)
    elif isinstance(option.default, int):
        field = forms.IntegerField(**kwargs)
    elif isinstance(option.default, float):
        field = forms.FloatField(**kwargs)
    else:
        field = forms.CharField(**kwargs)
    field.policies = policy  # type: ignore[attr-defined]
    return field
