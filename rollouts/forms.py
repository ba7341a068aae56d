"""Forms of the review studio. Batch options are validated by RolloutSettings, the one place."""

from __future__ import annotations

from typing import Any

from django import forms

from rollouts.crafter_env import ACHIEVEMENTS
from rollouts.model_endpoints import endpoint_settings
from rollouts.rollout_settings import (
    DEFAULT_SCRIPT,
    POLICIES,
    RolloutSettings,
    SettingsError,
    parse_seeds,
)
from rollouts.selectors_review import TurnFilters
from rollouts.services_review import NOTE_MAX_LENGTH
from studio.endpoints import EndpointError, endpoint_check_model, endpoints_enabled
from studio.models import Endpoint

# RolloutSettings names options the way the command line does; errors go on the form field.
_SETTINGS_FIELD = {
    "policy": "policy",
    "seeds": "seeds",
    "steps": "steps",
    "image-size": "image_size",
    "actions": "actions",
    "history-frames": "history_frames",
    "concurrency": "concurrency",
    "model": "model",
}


class BatchCreateForm(forms.Form):
    name = forms.CharField(max_length=200, required=False)
    policy = forms.ChoiceField(choices=[(p, p) for p in POLICIES], initial="scripted")
    model = forms.CharField(
        max_length=200, required=False, help_text="Model name for the openai policy."
    )
    # A choice among the endpoints an admin named, never a URL: the server's keys go only to
    # their own endpoint's URL, so no user can point them at a listener of their own.
    endpoint = forms.ModelChoiceField(
        queryset=Endpoint.objects.none(),
        to_field_name="name",
        required=False,
        empty_label="(none)",
        help_text="Model endpoint for the openai policy; an admin adds them under /admin/.",
    )
    seeds = forms.CharField(initial="0-3", help_text="7, 0-9 or 1,5,9-12")
    steps = forms.IntegerField(initial=256, min_value=1)
    image_size = forms.IntegerField(initial=64, min_value=1, label="Image size (px)")
    history_frames = forms.IntegerField(initial=0, min_value=0, label="History frames")
    concurrency = forms.IntegerField(
        required=False, min_value=1, help_text="Empty: the endpoint's default."
    )
    actions = forms.CharField(
        required=False,
        initial=" ".join(DEFAULT_SCRIPT),
        help_text="Scripted policy: action names separated by spaces, cycled.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["endpoint"]
        field.queryset = endpoints_enabled(kind=Endpoint.Kind.CHAT)
        default = field.queryset.filter(name="default").first()
        if default is not None:
            field.initial = default.name

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.errors:
            return data
        endpoint: Endpoint | None = data.get("endpoint")
        defaults: dict[str, Any] = {}
        if data["policy"] == "openai":
            if endpoint is None:
                self.add_error("endpoint", "endpoint: the openai policy needs an endpoint")
            else:
                try:
                    endpoint_check_model(endpoint=endpoint, model=data.get("model", "").strip())
                except EndpointError as exc:
                    self.add_error("model", str(exc))
                    return data
                defaults = endpoint_settings(endpoint)
        concurrency = data.get("concurrency") or defaults.get("concurrency", 4)
        try:
            seeds = tuple(parse_seeds(data["seeds"]))
            actions = tuple((data.get("actions") or "").split()) or DEFAULT_SCRIPT
            self.rollout_settings = RolloutSettings(
                policy=data["policy"],
                name=data.get("name", ""),
                model=data.get("model", "").strip(),
                endpoint=defaults.get("endpoint", ""),
                base_url=defaults.get("base_url", ""),
                requests_per_minute=defaults.get("requests_per_minute", 0),
                seeds=seeds,
                steps=data["steps"],
                image_size=data["image_size"],
                history_frames=data["history_frames"],
                concurrency=concurrency,
                actions=actions,
            )
        except SettingsError as exc:
            message = str(exc)
            key = message.split(":", 1)[0]
            self.add_error(_SETTINGS_FIELD.get(key), message)
        return data


FLAGGED_CHOICES = [("any", "any"), ("only", "flagged"), ("exclude", "not flagged")]
ERROR_CHOICES = [("any", "any"), ("yes", "with error"), ("no", "without error")]


class TurnFilterForm(forms.Form):
    batch = forms.IntegerField(required=False, min_value=1)
    model = forms.CharField(required=False, max_length=200)
    flagged = forms.ChoiceField(choices=FLAGGED_CHOICES, required=False)
    has_error = forms.ChoiceField(choices=ERROR_CHOICES, required=False, label="Error")
    achievement = forms.ChoiceField(
        choices=[("", "any")] + [(a, a) for a in ACHIEVEMENTS],
        required=False,
        label="Unlocked",
    )

    def filters(self) -> TurnFilters:
        """The validated filters; call after is_valid()."""
        data = self.cleaned_data
        return TurnFilters(
            batch_id=data.get("batch"),
            model=data.get("model") or "",
            flagged=data.get("flagged") or "any",
            has_error=data.get("has_error") or "any",
            achievement=data.get("achievement") or "",
        )


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
