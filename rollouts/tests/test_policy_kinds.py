"""A policy kind declared in one place shows on every face: forms, `rollout`, admin, pages.

The test declares a throwaway model-calling kind here (a "model" answered in the worker, no
endpoint) and looks for it everywhere a person picks or reads a policy; then removes it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.urls import reverse

from rollouts.forms import BatchCreateForm
from rollouts.management.commands.rollout import Command as RolloutCommand
from rollouts.models import RolloutBatch
from rollouts.play.forms import ForkForm
from rollouts.policies import kinds
from rollouts.policies.base import Decision, Observation
from rollouts.rollout_settings import RolloutSettings, SettingsError, settings_from_cli
from rollouts.tests.helpers import record_batch

NAME = "tinylocal"


class TinyLocalModel:
    """Answers `noop` as a model in the worker would, with its token counts."""

    calls_model = True

    def __init__(self, settings: RolloutSettings, **_: object) -> None:
        self.model = settings.model

    def decide(self, observation: Observation) -> Decision:
        return Decision(actions=["noop"], model_called=True, prompt_tokens=10, completion_tokens=2)

    def close(self) -> None:
        pass


@pytest.fixture
def tiny_kind() -> Iterator[kinds.PolicyKind]:
    kind = kinds.register(
        kinds.PolicyKind(
            name=NAME,
            factory=TinyLocalModel,
            help=f"{NAME} asks a model in the worker",
            calls_model=True,
            options=("model", "max_tokens"),
            own_options=(
                kinds.KindOption(
                    name="context_size",
                    default=2048,
                    minimum=256,
                    maximum=32_768,
                    help="tokens the local model reads",
                ),
            ),
        )
    )
    yield kind
    kinds.unregister(NAME)


def test_the_built_in_kinds_are_declared_once_each():
    names = [k.name for k in kinds.policy_kinds()]
    assert names == ["scripted", "random", "openai", "imported", "grpo", "human"]
    assert kinds.offered_names() == ("scripted", "random", "openai")
    assert kinds.model_policy_names() == ("openai",)
    assert kinds.policy_kind("openai").shows_history
    assert not kinds.policy_kind("human").played_by_worker
    # A GRPO job's model: played on its train worker only, at no cost.
    grpo = kinds.policy_kind("grpo")
    assert grpo.plays and not grpo.played_by_worker and not grpo.calls_model


def test_a_new_kind_is_a_choice_of_the_forms(tiny_kind, db):
    form = BatchCreateForm()
    assert (NAME, NAME) in list(form.fields["policy"].choices)
    assert NAME in str(form.fields["policy"].help_text)
    # Its options are shown for it on the page, the others' are not.
    assert NAME in str(form.fields["model"].policies).split()
    assert NAME in str(form.fields["max_tokens"].policies).split()
    assert NAME not in str(form.fields["temperature"].policies).split()
    assert NAME not in str(form.fields["endpoint"].policies).split()
    assert (NAME, NAME) in list(ForkForm().fields["policy"].choices)
    # An option of its own: a field shown for it only.
    assert form.fields["context_size"].initial == 2048
    assert str(form.fields["context_size"].policies) == NAME


def test_a_new_kind_is_validated_as_its_declaration_says(tiny_kind, db):
    with pytest.raises(SettingsError, match=f"the {NAME} policy needs --model"):
        RolloutSettings(policy=NAME)
    form = BatchCreateForm(data={"policy": NAME, "model": "tiny", "seeds": "0", "steps": 3})
    form.fields["image_size"].required = False
    assert form.is_valid(), form.errors
    assert form.rollout_settings.policy == NAME
    assert form.rollout_settings.endpoint == ""  # no endpoint: it calls none
    assert form.rollout_settings.extra == {"context_size": 2048}
    data = {"policy": NAME, "model": "tiny", "seeds": "0", "steps": 3, "context_size": 4096}
    form = BatchCreateForm(data=data)
    form.fields["image_size"].required = False
    assert form.is_valid(), form.errors
    assert form.rollout_settings.extra == {"context_size": 4096}
    form = BatchCreateForm(data={**data, "context_size": 10})
    form.fields["image_size"].required = False
    assert not form.is_valid() and "context_size" in form.errors
    with pytest.raises(SettingsError, match="context-size: 10 is not between 256"):
        RolloutSettings(policy=NAME, model="tiny", extra={"context_size": 10})


def test_a_new_kind_is_a_choice_of_the_rollout_command(tiny_kind, db):
    parser = RolloutCommand().create_parser("manage.py", "rollout")
    assert NAME in parser.format_help()
    assert parser.parse_args(["--policy", NAME, "--model", "tiny"]).policy == NAME
    assert "--context-size" in parser.format_help()
    given = vars(parser.parse_args(["--policy", NAME, "--model", "tiny", "--context-size", "4096"]))
    assert settings_from_cli(given).extra == {"context_size": 4096}
    openai = vars(parser.parse_args(["--policy", "openai", "--model", "m", "--base-url", "u"]))
    assert settings_from_cli(openai).extra == {}  # a batch of another kind keeps none
    assert "--policy is required" in _required_message()


def _required_message() -> str:
    from django.core.management import call_command
    from django.core.management.base import CommandError

    try:
        call_command("rollout")
    except CommandError as exc:
        assert NAME in str(exc)
        return str(exc)
    raise AssertionError("rollout without --policy ran")


def test_a_new_kind_shows_in_the_admin_and_on_its_batch_page(tiny_kind, client, admin_user):
    batch = record_batch(policy=NAME, model="tiny", seeds=(0,), steps=3)
    batch.refresh_from_db()
    assert batch.status == RolloutBatch.Status.FINISHED
    assert batch.policy_kind is tiny_kind
    assert batch.model_calls == 3  # the recorder counted its calls
    client.force_login(admin_user)
    changelist = client.get(reverse("admin:rollouts_rolloutbatch_changelist")).content.decode()
    assert f"?policy__exact={NAME}" in changelist
    change = client.get(reverse("admin:rollouts_rolloutbatch_change", args=[batch.id]))
    assert f'<option value="{NAME}" selected>' in change.content.decode()
    page = client.get(reverse("rollouts:batch_detail", args=[batch.id])).content.decode()
    assert "data-model-totals" in page  # a model-calling kind's counters
    assert "Max tokens" in page and "Temperature" not in page  # its options' rows
    assert "Context size" in page  # and its own option's
    new = client.get(reverse("rollouts:batch_create")).content.decode()
    assert f'<option value="{NAME}">' in new
