"""The dataset form: builds the same TurnSelection / ExportOptions the command builds."""

from __future__ import annotations

from typing import Any

from django import forms

from curation.export_options import FORMATS, MAX_HISTORY_FRAMES, ExportOptions, check_combination
from curation.models import Dataset
from curation.selectors import dataset_save_problems
from rollouts.game.crafter_env import ACHIEVEMENTS
from rollouts.models import RolloutBatch
from rollouts.review.turn_selection import (
    FLAGGED_CHOICES,
    FLAGGED_LABELS,
    FilterError,
    TurnSelection,
    check_references,
)

_ACHIEVEMENT_CHOICES = [(a, a) for a in ACHIEVEMENTS]
_LABEL_FIELDS = ("name", "description")
FORMAT_LABELS = {"studio": "Studio", "openai": "OpenAI", "synth": "Synth"}


class SearchableCheckboxes(forms.CheckboxSelectMultiple):
    """A checkbox list with a search box (studio.css / datasets.js): every choice visible."""

    template_name = "partials/searchable_checkboxes.html"


def _checkboxes(**kwargs: Any) -> forms.MultipleChoiceField:
    return forms.MultipleChoiceField(required=False, widget=SearchableCheckboxes, **kwargs)


class DatasetForm(forms.Form):
    name = forms.CharField(max_length=200)
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    batches = forms.TypedMultipleChoiceField(
        coerce=int,
        required=False,
        widget=SearchableCheckboxes,
        help_text="Turns of these batches only; none ticked means every batch.",
    )
    models = _checkboxes(help_text="Turns played by these models; none ticked means any.")
    policies = _checkboxes(
        choices=[(p.value, p.value) for p in RolloutBatch.Policy],
        help_text="openai (a model), the scripted and random baselines, or imported rows.",
    )
    require_achievements = _checkboxes(
        choices=_ACHIEVEMENT_CHOICES,
        label="Required achievements",
        help_text="Episodes that unlocked all of these (at any turn).",
    )
    exclude_achievements = _checkboxes(
        choices=_ACHIEVEMENT_CHOICES,
        label="Excluded achievements",
        help_text="Leave out episodes that unlocked any of these.",
    )
    min_unique = forms.IntegerField(
        required=False,
        min_value=0,
        max_value=len(ACHIEVEMENTS),
        label="Min unique achievements",
        help_text=f"Episodes that unlocked at least this many of the {len(ACHIEVEMENTS)}.",
    )
    min_reward = forms.FloatField(
        required=False,
        label="Min episode reward",
        help_text="Episodes whose total reward is at least this.",
    )
    user_image = forms.BooleanField(
        required=False,
        label="User image present",
        help_text="Rows whose user message shows an image (text-only observation mode has none).",
    )
    include_assistant = forms.BooleanField(
        required=False,
        label="Assistant image present",
        help_text="Only rows whose assistant messages hold an image: studio turns never "
        "have one (only some imported rows do), so this usually selects nothing.",
    )
    flagged = forms.ChoiceField(
        choices=[(c, FLAGGED_LABELS[c]) for c in FLAGGED_CHOICES],
        initial="any",
        help_text="Turns flagged in review.",
    )
    exclude_errors = forms.BooleanField(
        required=False,
        label="Exclude turns with errors",
        help_text="Leave out turns whose model call failed or whose answer was unusable.",
    )
    include_text_fallback = forms.BooleanField(
        required=False,
        label="Include text-fallback turns",
        help_text="Turns where the model answered in prose and its actions were read from "
        "the text. Left out by default (the model made no tool call); included, they are "
        "marked metadata.text_fallback. Studio format only.",
    )
    top_per_seed = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=1000,
        label="Top n episodes per seed",
        help_text="Best-of-N: by unique achievements, then reward (ties: earlier sample).",
    )
    at_or_above_mean = forms.BooleanField(
        required=False,
        label="At or above the seed's mean",
        help_text="Episodes whose reward is at least the mean of their seed's samples.",
    )
    kind = forms.ChoiceField(
        choices=[("sft", "SFT: one row per turn"), ("preference", "Preference pairs (DPO)")],
        initial="sft",
        required=False,
        label="Rows",
    )
    relabeled = forms.ChoiceField(
        choices=[("any", "any"), ("only", "relabeled only"), ("exclude", "exclude relabeled")],
        initial="any",
        required=False,
        label="Relabeled turns",
        help_text="Turns a reviewer corrected export the correction as the tool call.",
    )
    include_fork_prefix = forms.BooleanField(
        required=False,
        label="Include forks' replayed turns",
        help_text="A fork's turns before the fork point repeat its original; left out by default.",
    )
    history_frames = forms.IntegerField(
        min_value=0,
        max_value=MAX_HISTORY_FRAMES,
        initial=0,
        required=False,
        help_text="Baseline rows also show the frames of the previous K turns; model rows "
        "are exported as they were sent.",
    )
    format = forms.ChoiceField(
        choices=[(f, FORMAT_LABELS.get(f, f)) for f in FORMATS],
        initial="studio",
        help_text="Studio: rows with metadata. OpenAI: what OpenAI fine-tuning accepts (no "
        "metadata, at least 10 rows, at most 10 images a row). Synth: what synth-ai's SFT "
        "loader accepts (flat tools, metadata kept).",
    )
    val_fraction = forms.FloatField(
        min_value=0.0,
        max_value=0.99,
        initial=0.0,
        required=False,
        label="Validation fraction",
        help_text="Share of episodes sent to a validation file (by episode, never split).",
    )
    allow_empty = forms.BooleanField(
        required=False,
        label="Allow an empty export",
        help_text="Otherwise a version that selects no rows fails with the reason.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["batches"].choices = [
            (b.id, f"#{b.id} {b.name or b.policy} ({b.policy})")
            for b in RolloutBatch.objects.order_by("-id")
        ]
        models = sorted(set(RolloutBatch.objects.exclude(model="").values_list("model", flat=True)))
        self.fields["models"].choices = [(m, m) for m in models]
        self._filters: TurnSelection | None = None
        self._options: ExportOptions | None = None

    @classmethod
    def for_dataset(cls, dataset: Dataset, data: Any = None) -> DatasetForm:
        initial = {
            "name": dataset.name,
            "description": dataset.description,
            **TurnSelection.from_json(dataset.filters).to_json(),
            **ExportOptions.from_json(dataset.export_options).to_json(),
        }
        return cls(data=data, initial=initial)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        # The filter stands without a name: live counts show while the name is still empty.
        if any(name not in _LABEL_FIELDS for name in self.errors):
            return data
        try:
            self._filters = TurnSelection(
                batches=tuple(data.get("batches") or ()),
                models=tuple(data.get("models") or ()),
                policies=tuple(data.get("policies") or ()),
                require_achievements=tuple(data.get("require_achievements") or ()),
                exclude_achievements=tuple(data.get("exclude_achievements") or ()),
                min_unique=data.get("min_unique"),
                min_reward=data.get("min_reward"),
                user_image=bool(data.get("user_image")),
                include_assistant=bool(data.get("include_assistant")),
                flagged=data.get("flagged") or "any",
                exclude_errors=bool(data.get("exclude_errors")),
                include_text_fallback=bool(data.get("include_text_fallback")),
                relabeled=data.get("relabeled") or "any",
                include_fork_prefix=bool(data.get("include_fork_prefix")),
                top_per_seed=data.get("top_per_seed"),
                at_or_above_mean=bool(data.get("at_or_above_mean")),
            )
            self._options = ExportOptions(
                history_frames=data.get("history_frames") or 0,
                format=data.get("format") or "studio",
                val_fraction=data.get("val_fraction") or 0.0,
                allow_empty=bool(data.get("allow_empty")),
                kind=data.get("kind") or "sft",
            )
            check_references(self._filters)
            check_combination(self._filters, self._options)
        except FilterError as exc:
            raise forms.ValidationError(str(exc)) from exc
        # Refused when saved, not at export time (the live counts show it as well).
        problems = dataset_save_problems(filters=self._filters, options=self._options)
        if problems:
            raise forms.ValidationError(problems)
        return data

    @property
    def has_filters(self) -> bool:
        """The filter and options parsed, whatever else is wrong with the form."""
        return self._filters is not None and self._options is not None

    @property
    def filters(self) -> TurnSelection:
        assert self._filters is not None, "call is_valid() first"
        return self._filters

    @property
    def options(self) -> ExportOptions:
        assert self._options is not None, "call is_valid() first"
        return self._options


class ImportForm(forms.Form):
    file = forms.FileField(help_text="JSONL: this studio's rows, synth-ai SFT rows or OpenAI chat")
    name = forms.CharField(max_length=200, required=False)
    skip_existing = forms.BooleanField(
        required=False,
        label="Skip turns already here",
        help_text="Leave out rows whose turns are in the studio already (else: refuse the file).",
    )
