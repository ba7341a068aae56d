"""Forms of human play, forks and relabels. Options are validated by RolloutSettings."""

from __future__ import annotations

from typing import Any

from django import forms

from rollouts.forms_settings import settings_form_field, settings_value
from rollouts.game.crafter_env import ACTIONS
from rollouts.policies import kinds
from rollouts.policies.endpoints import endpoint_settings
from rollouts.review.services import RELABEL_MAX_ACTIONS, RELABEL_REASON_MAX_LENGTH
from rollouts.rollout_settings import (
    DEFAULT_SCRIPT,
    HUMAN_POLICY,
    MAX_SEED,
    RolloutSettings,
    SettingsError,
)
from studio.endpoints import EndpointError, endpoint_check_model, endpoints_enabled
from studio.models import Endpoint


class PlayNewForm(forms.Form):
    seed = forms.IntegerField(min_value=0, max_value=MAX_SEED, initial=0)
    # A person's game is longer than a batch's default; the bounds are any batch's.
    steps = settings_form_field("steps", initial=1000, help_text="The game ends at this step.")
    image_size = forms.TypedChoiceField(
        coerce=int,
        choices=[(64, "64 px (what models see by default)"), (128, "128 px"), (256, "256 px")],
        initial=64,
        label="Image size",
    )


def fork_policy_choices() -> list[tuple[str, str]]:
    """A person plays the fork, or one of the kinds people pick."""
    human = kinds.policy_kind(HUMAN_POLICY)
    return [(human.name, human.choice_label), *((n, n) for n in kinds.offered_names())]


class ForkForm(forms.Form):
    turn = forms.IntegerField(min_value=0)
    policy = forms.ChoiceField(choices=fork_policy_choices, initial=HUMAN_POLICY)
    model = settings_form_field("model", help_text="openai policy")
    # One of the endpoints an admin named, never a URL (as on the batch form): the server's
    # keys go only to their own endpoint.
    endpoint = forms.ChoiceField(required=False, help_text="openai policy")
    actions = settings_form_field("actions", help_text="scripted policy")
    steps = settings_form_field(
        "steps", required=False, initial=None, help_text="default: the original's"
    )
    with_correction = forms.BooleanField(required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # One query for the choices (the viewer renders this form on every page).
        names = list(endpoints_enabled(kind=Endpoint.Kind.CHAT).values_list("name", flat=True))
        field = self.fields["endpoint"]
        field.choices = [("", "(endpoint)"), *((n, n) for n in names)]
        # As `studio.endpoints.endpoint_preselected` (from the names read here): with
        # several, none.
        field.initial = names[0] if len(names) == 1 else None

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.errors:
            return data
        values: dict[str, Any] = {
            "policy": data["policy"],
            "model": (data.get("model") or "").strip(),
            "actions": settings_value("actions", data.get("actions") or "") or DEFAULT_SCRIPT,
        }
        if kinds.policy_kind(data["policy"]).needs_endpoint:
            name = data.get("endpoint")
            endpoint = endpoints_enabled(kind=Endpoint.Kind.CHAT).filter(name=name).first()
            if not name or endpoint is None:
                raise forms.ValidationError("endpoint: choose one of the endpoints an admin named")
            try:
                endpoint_check_model(endpoint=endpoint, model=values["model"])
            except EndpointError as exc:
                raise forms.ValidationError(str(exc)) from exc
            values.update(endpoint_settings(endpoint))
        try:
            self.rollout_settings = RolloutSettings(**values)
        except SettingsError as exc:
            raise forms.ValidationError(str(exc)) from exc
        return data


class RelabelForm(forms.Form):
    actions = forms.CharField(required=False, help_text="action names separated by spaces")
    reason = forms.CharField(required=False, max_length=RELABEL_REASON_MAX_LENGTH)
    remove = forms.BooleanField(required=False)

    def clean_actions(self) -> list[str]:
        names = self.cleaned_data["actions"].split()
        if self.data.get("remove"):
            return []
        if not 1 <= len(names) <= RELABEL_MAX_ACTIONS:
            raise forms.ValidationError(f"pick 1 to {RELABEL_MAX_ACTIONS} actions")
        unknown = [n for n in names if n not in ACTIONS]
        if unknown:
            raise forms.ValidationError(f"{unknown[0][:40]!r} is not one of crafter's actions")
        return names
