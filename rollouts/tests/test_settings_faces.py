"""A batch's options have two faces, `manage.py rollout` and the batch form: the same defaults,
choices and bounds, and the same words when a value is out of bounds.

The expected values are written out here, by hand: those the docs give (`docs/recording.md`:
the image size 64, the step limit 256, the scripted policy's actions, the policies), the
others as the command has always had them.
"""

from __future__ import annotations

import dataclasses

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from rollouts.forms import BatchCreateForm
from rollouts.management.commands.rollout import Command
from rollouts.models import RolloutBatch
from rollouts.rollout_settings import RolloutSettings, settings_from_cli
from studio.models import Endpoint

pytestmark = pytest.mark.django_db

SPEC_POLICIES = ("scripted", "random", "openai")
SPEC_SCRIPT = ("move_right", "move_down", "move_left", "move_up", "do")
NO_DEFAULT = object()
# (the settings' default, the flag's default, the form's initial value). None for the limits
# an endpoint sets: not given on either face, the endpoint's value applies, else FALLBACK's.
DEFAULTS = {
    "policy": (NO_DEFAULT, None, None),
    "seeds": ((0,), "0", "0"),
    "samples_per_seed": (1, 1, 1),
    "steps": (256, 256, 256),
    "image_size": (64, 64, 64),
    "actions": (SPEC_SCRIPT, list(SPEC_SCRIPT), " ".join(SPEC_SCRIPT)),
    "name": ("", "", ""),
    "model": ("", "", ""),
    "history_frames": (0, 0, 0),
    "concurrency": (4, None, None),
    "temperature": (0.0, 0.0, 0.0),
    "max_tokens": (512, 512, 512),
    "image_detail": ("auto", "auto", "auto"),
    "observation_mode": ("image_text", "image_text", "image_text"),
    "on_bad_output": ("noop", "noop", "noop"),
    "max_retries": (4, 4, 4),
    "request_timeout": (60.0, 60.0, 60.0),
    "requests_per_minute": (0, None, None),
}
FALLBACK = {"concurrency": 4, "requests_per_minute": 0}
# Flags without a form field: the page offers a choice among named endpoints, never a URL.
CLI_ONLY = {"endpoint": ("", "", None), "base_url": ("", "", None)}
CHOICES = {
    "policy": SPEC_POLICIES,
    "image_detail": ("auto", "low", "high"),
    "observation_mode": ("image_text", "image", "text"),
    "on_bad_output": ("noop", "end"),
}
# (option, out-of-bounds value, what both faces say)
REFUSED = [
    ("samples_per_seed", "0", "0 is not between 1 and 64"),
    ("samples_per_seed", "65", "65 is not between 1 and 64"),
    ("steps", "0", "0 is not between 1 and 10000"),
    ("steps", "10001", "10001 is not between 1 and 10000"),
    ("image_size", "17", "17 is not between 18 and 1024 (crafter draws nothing below 18 px)"),
    ("image_size", "1025", "1025 is not between 18 and 1024 (crafter draws nothing below 18 px)"),
    ("history_frames", "-1", "-1 is not between 0 and 9"),
    ("history_frames", "10", "10 is not between 0 and 9"),
    ("concurrency", "0", "0 is not between 1 and 256"),
    ("concurrency", "257", "257 is not between 1 and 256"),
    ("temperature", "-0.5", "-0.5 is not between 0 and 2"),
    ("temperature", "2.5", "2.5 is not between 0 and 2"),
    ("max_tokens", "0", "0 is not between 1 and 32768"),
    ("max_tokens", "32769", "32769 is not between 1 and 32768"),
    ("max_retries", "-1", "-1 is not between 0 and 20"),
    ("max_retries", "21", "21 is not between 0 and 20"),
    ("request_timeout", "0", "0.0 is not in (0, 600]"),
    ("request_timeout", "600.5", "600.5 is not in (0, 600]"),
    ("requests_per_minute", "-1", "must be 0 (no limit) or more"),
]
# (option, the smallest and the largest value both faces take; None: no largest)
ACCEPTED = {
    "samples_per_seed": ("1", "64"),
    "steps": ("1", "10000"),
    "image_size": ("18", "1024"),
    "history_frames": ("0", "9"),
    "concurrency": ("1", "256"),
    "temperature": ("0", "2"),
    "max_tokens": ("1", "32768"),
    "max_retries": ("0", "20"),
    "request_timeout": ("0.001", "600"),
    "requests_per_minute": ("0", None),
}


def _parser():
    return Command().create_parser("manage.py", "rollout")


@pytest.fixture
def endpoint() -> Endpoint:
    return Endpoint.objects.create(name="faces", base_url="http://127.0.0.1:9/v1")


def _form(option: str, value: str, endpoint: Endpoint) -> BatchCreateForm:
    data = {
        "policy": "openai",
        "model": "m",
        "endpoint": endpoint.name,
        "seeds": "1",
        "steps": "5",
        "image_size": "64",
        option: value,
    }
    form = BatchCreateForm(data)
    form.is_valid()
    return form


def _cli_options(*args: str) -> dict:
    return vars(_parser().parse_args(["--policy", "openai", "--model", "m", *args]))


def test_every_option_has_the_same_default_on_both_faces():
    declared = {f.name: f for f in dataclasses.fields(RolloutSettings)}
    assert set(declared) - {"extra"} == set(DEFAULTS) | set(CLI_ONLY)
    parser, form = _parser(), BatchCreateForm()
    for name, (default, flag, initial) in {**DEFAULTS, **CLI_ONLY}.items():
        field = declared[name]
        has_default = field.default is not dataclasses.MISSING
        assert (field.default if has_default else NO_DEFAULT) == default, name
        assert parser.get_default(name) == flag, name
        if name in DEFAULTS:
            assert form.fields[name].initial == initial, name
    # Not given on either face: an endpoint's limit is its own, else the settings' default.
    limits = Endpoint.objects.create(
        name="limits", base_url="http://127.0.0.1:9/v1", concurrency=7, requests_per_minute=70
    )
    own = {"concurrency": 7, "requests_per_minute": 70}
    flags = vars(_parser().parse_args(["--policy", "random"]))
    page = BatchCreateForm({"policy": "random", "seeds": "1", "steps": "5", "image_size": "64"})
    assert page.is_valid(), page.errors
    flags_endpoint = settings_from_cli(
        _cli_options("--endpoint", "limits"), endpoint={"endpoint": "limits", **own}
    )
    page_endpoint = _form("steps", "5", limits)
    for name, fallback in FALLBACK.items():
        assert getattr(settings_from_cli(flags), name) == fallback, name
        assert getattr(page.rollout_settings, name) == fallback, name
        assert getattr(flags_endpoint, name) == own[name], name
        assert getattr(page_endpoint.rollout_settings, name) == own[name], name


def test_every_choice_is_the_same_on_both_faces():
    parser, form = _parser(), BatchCreateForm()
    actions = {a.dest: a for a in parser._actions}
    for name, choices in CHOICES.items():
        assert tuple(actions[name].choices) == choices, name
        assert tuple(value for value, _ in form.fields[name].choices) == choices, name


@pytest.mark.parametrize(("option", "value", "message"), REFUSED)
def test_a_value_out_of_bounds_is_refused_by_both_faces_in_the_same_words(
    option, value, message, endpoint
):
    flag = "--" + option.replace("_", "-")
    with pytest.raises(CommandError) as refused:
        call_command(
            "rollout",
            "--policy",
            "openai",
            "--model",
            "m",
            "--endpoint",
            endpoint.name,
            f"{flag}={value}",
            "--inline",
        )
    assert refused.value.returncode == 2
    assert str(refused.value) == f"{option.replace('_', '-')}: {message}"
    form = _form(option, value, endpoint)
    page_words = message[:1].upper() + message[1:] + "."
    assert form.errors[option] == [page_words]
    assert RolloutBatch.objects.count() == 0


@pytest.mark.parametrize("option", sorted(ACCEPTED))
def test_the_bounds_themselves_are_taken_by_both_faces(option, endpoint):
    flag = "--" + option.replace("_", "-")
    for value in filter(None, ACCEPTED[option]):
        from_flags = settings_from_cli(_cli_options("--endpoint", endpoint.name, f"{flag}={value}"))
        form = _form(option, value, endpoint)
        assert form.is_valid(), (option, value, form.errors)
        assert getattr(from_flags, option) == getattr(form.rollout_settings, option)
        assert float(getattr(form.rollout_settings, option)) == float(value)


@pytest.mark.parametrize(
    ("value", "message"),
    [("0", "0 is not between 1 and 10000."), ("10001", "10001 is not between 1 and 10000.")],
)
def test_the_other_forms_with_a_step_limit_say_the_same(value, message):
    from evaluation.forms import EvaluateForm
    from rollouts.play.forms import ForkForm, PlayNewForm

    for form in (
        ForkForm({"turn": "0", "policy": "random", "steps": value}),
        PlayNewForm({"seed": "0", "image_size": "64", "steps": value}),
        EvaluateForm({"count": "2", "steps": value}),
    ):
        assert not form.is_valid()
        assert form.errors["steps"] == [message], type(form).__name__
