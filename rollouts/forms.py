"""Forms of the review studio. Batch options are validated by RolloutSettings, the one place."""

from __future__ import annotations

import dataclasses
from typing import Any

from django import forms

from rollouts.crafter_env import ACHIEVEMENTS
from rollouts.model_endpoints import endpoint_settings
from rollouts.rollout_settings import (
    DEFAULT_SCRIPT,
    IMAGE_DETAILS,
    POLICIES,
    RolloutSettings,
    SettingsError,
    parse_seeds,
    seeds_spec,
)
from rollouts.services_review import NOTE_MAX_LENGTH
from rollouts.turn_selection import (
    ERROR_CHOICES,
    EVERY_TURN,
    FLAGGED_CHOICES,
    FLAGGED_LABELS,
    REWARD_CHOICES,
    TurnSelection,
)
from studio.endpoints import EndpointError, endpoint_check_model, endpoints_enabled
from studio.models import Endpoint

_DEFAULTS = RolloutSettings.unchecked(policy="scripted")
OPENAI_ONLY = "openai"


def _only_for(field: forms.Field, policies: str) -> forms.Field:
    """The field applies to these policies only (space-separated); the page hides it else."""
    field.policies = policies  # type: ignore[attr-defined]
    # Hidden and not sent for other policies: the settings' default applies then.
    field.required = False
    return field


def _page_message(message: str) -> str:
    """RolloutSettings words its problems for the command line; the page names no flags."""
    message = message.replace("needs --model", "needs a model name")
    return message[:1].upper() + message[1:] + ("" if message.endswith(".") else ".")


class BatchCreateForm(forms.Form):
    """Every option of RolloutSettings; defaults come from it, so they cannot differ."""

    name = forms.CharField(max_length=200, required=False)
    policy = forms.ChoiceField(
        choices=[(p, p) for p in POLICIES],
        initial="scripted",
        help_text="scripted cycles a list of actions; random picks uniformly; openai asks a model.",
    )
    model = _only_for(
        forms.CharField(max_length=200, required=False, help_text="Model name, e.g. gpt-4o-mini."),
        OPENAI_ONLY,
    )
    # A choice among the endpoints an admin named, never a URL: the server's keys go only to
    # their own endpoint's URL, so no user can point them at a listener of their own.
    endpoint = _only_for(
        forms.ModelChoiceField(
            queryset=Endpoint.objects.none(),
            to_field_name="name",
            empty_label="(choose)",
            help_text="Model servers an admin named (under /admin/); no URL is typed here.",
        ),
        OPENAI_ONLY,
    )
    seeds = forms.CharField(initial="0-3", help_text="7, 0-9 or 1,5,9-12; one episode each.")
    samples_per_seed = forms.IntegerField(
        initial=_DEFAULTS.samples_per_seed,
        min_value=1,
        required=False,
        label="Samples per seed",
        help_text="Play each seed K times (best-of-N, preference pairs).",
    )
    steps = forms.IntegerField(
        initial=_DEFAULTS.steps, min_value=1, help_text="Step limit of each episode."
    )
    image_size = forms.IntegerField(
        initial=_DEFAULTS.image_size, min_value=1, label="Image size (px)"
    )
    actions = _only_for(
        forms.CharField(
            required=False,
            initial=" ".join(DEFAULT_SCRIPT),
            help_text="Action names separated by spaces, cycled.",
        ),
        "scripted",
    )
    observation_mode = _only_for(
        forms.ChoiceField(
            choices=[
                ("image_text", "image and text"),
                ("image", "image only"),
                ("text", "text only"),
            ],
            initial=_DEFAULTS.observation_mode,
            label="Observation",
            help_text="What the model is shown each turn.",
        ),
        OPENAI_ONLY,
    )
    history_frames = _only_for(
        forms.IntegerField(
            initial=_DEFAULTS.history_frames,
            min_value=0,
            label="History frames",
            help_text="Also show the last K turns' frames (0-9).",
        ),
        OPENAI_ONLY,
    )
    image_detail = _only_for(
        forms.ChoiceField(
            choices=[(d, d) for d in IMAGE_DETAILS],
            initial=_DEFAULTS.image_detail,
            help_text="low costs 85 tokens an image.",
        ),
        OPENAI_ONLY,
    )
    temperature = _only_for(
        forms.FloatField(initial=_DEFAULTS.temperature, help_text="0 to 2."), OPENAI_ONLY
    )
    max_tokens = _only_for(
        forms.IntegerField(initial=_DEFAULTS.max_tokens, label="Max tokens"), OPENAI_ONLY
    )
    on_bad_output = _only_for(
        forms.ChoiceField(
            choices=[("noop", "play noop and go on"), ("end", "end the episode")],
            initial=_DEFAULTS.on_bad_output,
            label="On bad output",
            help_text="After a failed call or an unusable answer.",
        ),
        OPENAI_ONLY,
    )
    max_retries = _only_for(
        forms.IntegerField(
            initial=_DEFAULTS.max_retries,
            label="Retries",
            help_text="Of a 429, 5xx, timeout or dropped connection (0-20).",
        ),
        OPENAI_ONLY,
    )
    request_timeout = _only_for(
        forms.FloatField(
            initial=_DEFAULTS.request_timeout, label="Request timeout (s)", help_text="Up to 600."
        ),
        OPENAI_ONLY,
    )
    # Empty: the endpoint's own defaults, set by its admin.
    concurrency = _only_for(
        forms.IntegerField(
            help_text="Most requests in flight to the endpoint, across all workers; "
            "empty: the endpoint's default.",
        ),
        OPENAI_ONLY,
    )
    requests_per_minute = _only_for(
        forms.IntegerField(
            label="Requests per minute",
            help_text="Per endpoint, across all workers; 0 = no limit; empty: the endpoint's.",
        ),
        OPENAI_ONLY,
    )

    _SETTINGS_FIELDS = (
        "model",
        "samples_per_seed",
        "steps",
        "image_size",
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
        initial = {name: getattr(settings, name) for name in cls._SETTINGS_FIELDS}
        initial.update(
            name=settings.name,
            policy=settings.policy,
            endpoint=settings.endpoint,
            seeds=seeds_spec(settings.seeds),
            actions=" ".join(settings.actions),
        )
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
        values: dict[str, Any] = {"policy": data.get("policy") or "scripted"}
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
                    self.add_error("model", _page_message(str(exc).split(": ", 1)[-1]))
                values.update(endpoint_settings(endpoint))
        try:
            values["seeds"] = tuple(parse_seeds(data.get("seeds") or ""))
        except SettingsError as exc:
            if "seeds" not in self.errors:
                self.add_error("seeds", _page_message(str(exc).split(": ", 1)[-1]))
        for name in self._SETTINGS_FIELDS:
            # Not sent (a field of another policy): the settings' default applies.
            if data.get(name) not in (None, "") and name not in self.errors:
                values[name] = data[name]
        values["model"] = (data.get("model") or "").strip()
        values["name"] = data.get("name", "")
        values["actions"] = tuple((data.get("actions") or "").split()) or DEFAULT_SCRIPT
        # Every problem at once, each on its field.
        for field_name, message in RolloutSettings.unchecked(**values).problems():
            if field_name in self.fields and field_name not in self.errors:
                self.add_error(field_name, _page_message(message))
        if not self.errors:
            self.rollout_settings = RolloutSettings(**values)
        return data


_ERROR_LABELS = {"any": "any", "yes": "with error", "no": "without error"}
_REWARD_LABELS = {"any": "any", "positive": "> 0", "zero": "= 0", "negative": "< 0"}


class TurnFilterForm(forms.Form):
    """The turn list's filters: a TurnSelection narrowed from every turn (`EVERY_TURN`)."""

    batch = forms.IntegerField(required=False, min_value=1)
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
    seed = forms.IntegerField(required=False, min_value=0)
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
