"""Forms of the review studio. Batch options are validated by RolloutSettings, the one place."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings as django_settings

from rollouts.crafter_env import ACHIEVEMENTS
from rollouts.rollout_settings import (
    DEFAULT_SCRIPT,
    POLICIES,
    RolloutSettings,
    SettingsError,
    parse_seeds,
)
from rollouts.selectors_review import TurnFilters
from rollouts.services_review import NOTE_MAX_LENGTH

# RolloutSettings names options the way the command line does; errors go on the form field.
_SETTINGS_FIELD = {
    "policy": "policy",
    "seeds": "seeds",
    "samples-per-seed": "samples_per_seed",
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
    base_url = forms.URLField(
        max_length=500,
        required=False,
        label="Endpoint",
        assume_scheme="https",
        help_text="OpenAI-compatible base URL; empty uses OPENAI_BASE_URL. Keys never go here.",
    )
    seeds = forms.CharField(initial="0-3", help_text="7, 0-9 or 1,5,9-12")
    samples_per_seed = forms.IntegerField(
        initial=1,
        min_value=1,
        required=False,
        label="Samples per seed",
        help_text="Play each seed K times (best-of-N, preference pairs).",
    )
    steps = forms.IntegerField(initial=256, min_value=1)
    image_size = forms.IntegerField(initial=64, min_value=1, label="Image size (px)")
    history_frames = forms.IntegerField(initial=0, min_value=0, label="History frames")
    concurrency = forms.IntegerField(initial=4, min_value=1)
    actions = forms.CharField(
        required=False,
        initial=" ".join(DEFAULT_SCRIPT),
        help_text="Scripted policy: action names separated by spaces, cycled.",
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.errors:
            return data
        try:
            seeds = tuple(parse_seeds(data["seeds"]))
            actions = tuple((data.get("actions") or "").split()) or DEFAULT_SCRIPT
            self.rollout_settings = RolloutSettings(
                policy=data["policy"],
                name=data.get("name", ""),
                model=data.get("model", "").strip(),
                base_url=(data.get("base_url") or "").strip()
                or (django_settings.OPENAI_BASE_URL if data["policy"] == "openai" else ""),
                seeds=seeds,
                samples_per_seed=data.get("samples_per_seed") or 1,
                steps=data["steps"],
                image_size=data["image_size"],
                history_frames=data["history_frames"],
                concurrency=data["concurrency"],
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
