"""The batch form. Batch options are declared and validated by RolloutSettings."""

from __future__ import annotations

from typing import Any

from django import forms

from rollouts.forms_settings import (
    own_option_field,
    page_message,
    page_value,
    policies_using,
    settings_form_field,
    settings_value,
)
from rollouts.policies import kinds
from rollouts.policies.endpoints import endpoint_settings
from rollouts.rollout_settings import RolloutSettings, SettingsError, options
from studio.endpoints import (
    EndpointError,
    endpoint_check_model,
    endpoint_preselected,
    endpoints_enabled,
)
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
    endpoint.policies = policies_using("endpoint")  # type: ignore[attr-defined]

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
        initial.update(settings.extra)  # the options its kind has of its own
        return initial

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["endpoint"]
        field.queryset = endpoints_enabled(kind=Endpoint.Kind.CHAT)
        if not self.initial.get("endpoint"):
            field.initial = endpoint_preselected(kind=Endpoint.Kind.CHAT)
        # Options a kind has of its own (`PolicyKind.own_options`), read as the form is made.
        for kind, own in kinds.own_options():
            if own.name not in self.fields:
                self.fields[own.name] = own_option_field(own, policy=kind.name)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        # An unknown policy is its field's error; the other fields are checked as for the first.
        values: dict[str, Any] = {"policy": data.get("policy") or kinds.offered_names()[0]}
        if kinds.policy_kind(values["policy"]).needs_endpoint:
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
        chosen = kinds.policy_kind(values["policy"])
        if chosen.own_options:
            values["extra"] = kinds.own_values(chosen, data)
        # Every problem at once, each on its field.
        for field_name, message in RolloutSettings.unchecked(**values).problems():
            if field_name in self.fields and field_name not in self.errors:
                self.add_error(field_name, page_message(message))
        if not self.errors:
            self.rollout_settings = RolloutSettings(**values)
        return data
