"""Forms of the review studio. Batch options are declared and validated by RolloutSettings."""

from __future__ import annotations

import dataclasses
from typing import Any

from django import forms

from rollouts.crafter_env import ACHIEVEMENTS
from rollouts.forms_settings import page_message, page_value, settings_form_field, settings_value
from rollouts.model_endpoints import endpoint_settings
from rollouts.rollout_settings import (
    OPENAI_ONLY,
    POLICIES,
    RolloutSettings,
    SettingsError,
    options,
)
from rollouts.services_review import NOTE_MAX_LENGTH
from rollouts.turn_selection import (
    BIGINT_MAX,
    ERROR_CHOICES,
    EVERY_TURN,
    FLAGGED_CHOICES,
    FLAGGED_LABELS,
    REWARD_CHOICES,
    TurnSelection,
)
from studio.endpoints import EndpointError, endpoint_check_model, endpoints_enabled
from studio.models import Endpoint

# Every option RolloutSettings declares for the page, its field made from the declaration.
_OPTION_NAMES = tuple(f.name for f, spec in options() if spec.form)
RolloutOptionsForm = type(forms.Form)(
    "RolloutOptionsForm",
    (forms.Form,),
    {"__module__": __name__, **{name: settings_form_field(name) for name in _OPTION_NAMES}},
)


class BatchCreateForm(RolloutOptionsForm):  # type: ignore[misc, valid-type]
    """Every option of RolloutSettings; defaults, bounds and choices come from it, so they
    cannot differ from the `rollout` command's."""

    # A choice among the endpoints an admin named, never a URL: the server's keys go only to
    # their own endpoint's URL, so no user can point them at a listener of their own.
    endpoint = forms.ModelChoiceField(
        queryset=Endpoint.objects.none(),
        to_field_name="name",
        empty_label="(choose)",
        required=False,  # hidden and not sent for the other policies
        help_text="Model servers an admin named (under /admin/); no URL is typed here.",
    )
    endpoint.policies = OPENAI_ONLY  # type: ignore[attr-defined]

    field_order = (
        "name",
        "policy",
        "model",
        "endpoint",
        "seeds",
        "samples_per_seed",
        "steps",
        "image_size",
        "actions",
        "observation_mode",
        "history_frames",
        "image_detail",
        "temperature",
        "max_tokens",
        "on_bad_output",
        "max_retries",
        "request_timeout",
        "concurrency",
        "requests_per_minute",
    )

    @classmethod
    def initial_from(cls, settings: RolloutSettings) -> dict[str, Any]:
        """The form filled with a batch's settings ("Run again")."""
        initial = {name: page_value(name, getattr(settings, name)) for name in _OPTION_NAMES}
        initial["endpoint"] = settings.endpoint
        return initial

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["endpoint"]
        field.queryset = endpoints_enabled(kind=Endpoint.Kind.CHAT)
        if not self.initial.get("endpoint"):
            default = field.queryset.filter(name="default").first()
            field.initial = default.name if default is not None else None

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        # An unknown policy is its field's error; the other fields are checked as for the first.
        values: dict[str, Any] = {"policy": data.get("policy") or POLICIES[0]}
        if values["policy"] == OPENAI_ONLY:
            # The endpoint fixes the URL (and so the key) and gives the limits' defaults.
            endpoint: Endpoint | None = data.get("endpoint")
            if endpoint is None:
                if "endpoint" not in self.errors:
                    self.add_error("endpoint", "Choose one of the endpoints an admin named.")
            else:
                try:
                    endpoint_check_model(endpoint=endpoint, model=(data.get("model") or "").strip())
                except EndpointError as exc:
                    self.add_error("model", page_message(str(exc).split(": ", 1)[-1]))
                values.update(endpoint_settings(endpoint))
        for name in _OPTION_NAMES:
            # Not sent (a field of another policy): the settings' (or endpoint's) default applies.
            if name == "policy" or data.get(name) in (None, "") or name in self.errors:
                continue
            try:
                values[name] = settings_value(name, data[name])
            except SettingsError as exc:
                self.add_error(name, page_message(str(exc).split(": ", 1)[-1]))
        # Every problem at once, each on its field.
        for field_name, message in RolloutSettings.unchecked(**values).problems():
            if field_name in self.fields and field_name not in self.errors:
                self.add_error(field_name, page_message(message))
        if not self.errors:
            self.rollout_settings = RolloutSettings(**values)
        return data


_ERROR_LABELS = {"any": "any", "yes": "with error", "no": "without error"}
_REWARD_LABELS = {"any": "any", "positive": "> 0", "zero": "= 0", "negative": "< 0"}


class TurnFilterForm(forms.Form):
    """The turn list's filters: a TurnSelection narrowed from every turn (`EVERY_TURN`)."""

    batch = forms.IntegerField(required=False, min_value=1, max_value=BIGINT_MAX)
    model = forms.CharField(required=False, max_length=200)
    flagged = forms.ChoiceField(
        choices=[(c, FLAGGED_LABELS[c]) for c in FLAGGED_CHOICES], required=False
    )
    has_error = forms.ChoiceField(
        choices=[(c, _ERROR_LABELS[c]) for c in ERROR_CHOICES], required=False, label="Error"
    )
    achievement = forms.ChoiceField(
        choices=[("", "any")] + [(a, a) for a in ACHIEVEMENTS],
        required=False,
        label="Unlocked",
    )
    policy = forms.ChoiceField(
        choices=[("", "any"), *((p, p) for p in (*POLICIES, "imported", "human"))], required=False
    )
    seed = forms.IntegerField(required=False, min_value=0, max_value=BIGINT_MAX)
    reward = forms.ChoiceField(
        choices=[(c, _REWARD_LABELS[c]) for c in REWARD_CHOICES], required=False
    )
    q = forms.CharField(
        required=False,
        max_length=200,
        label="Search",
        help_text="Model text, notes and observation text.",
    )

    def filters(self) -> TurnSelection:
        """The validated filters; call after is_valid()."""
        data = self.cleaned_data
        batch, model, policy = data.get("batch"), data.get("model"), data.get("policy")
        seed, achievement = data.get("seed"), data.get("achievement")
        return dataclasses.replace(
            EVERY_TURN,
            batches=(batch,) if batch is not None else (),
            models=(model,) if model else (),
            policies=(policy,) if policy else (),
            seeds=(seed,) if seed is not None else (),
            turn_unlocked=(achievement,) if achievement else (),
            flagged=data.get("flagged") or "any",
            has_error=data.get("has_error") or "any",
            reward=data.get("reward") or "any",
            search=(data.get("q") or "").strip(),
        )

    @staticmethod
    def query_for(selection: TurnSelection) -> dict[str, Any]:
        """The form's fields for a selection it made (a bulk flag's link back to the list)."""
        values: dict[str, Any] = {
            "batch": selection.batches[0] if selection.batches else None,
            "model": selection.models[0] if selection.models else "",
            "flagged": selection.flagged,
            "has_error": selection.has_error,
            "achievement": selection.turn_unlocked[0] if selection.turn_unlocked else "",
            "policy": selection.policies[0] if selection.policies else "",
            "seed": selection.seeds[0] if selection.seeds else None,
            "reward": selection.reward,
            "q": selection.search,
        }
        return {k: v for k, v in values.items() if v not in (None, "", "any")}


class FlagForm(forms.Form):
    """The wanted state, not a toggle: sending it twice changes nothing the second time."""

    flagged = forms.TypedChoiceField(
        choices=[("1", "flag"), ("0", "unflag")], coerce=lambda v: v == "1"
    )


class TurnNoteForm(forms.Form):
    note = forms.CharField(required=False, max_length=NOTE_MAX_LENGTH, strip=True)


class BulkFlagForm(forms.Form):
    """A field name of its own: `flagged` is already the filter (any / only / exclude)."""

    set_flagged = forms.TypedChoiceField(
        choices=[("1", "flag"), ("0", "unflag")], coerce=lambda v: v == "1"
    )
