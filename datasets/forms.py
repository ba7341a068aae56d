"""The dataset form: builds the same DatasetFilters / ExportOptions the command builds."""

from __future__ import annotations

from typing import Any

from django import forms

from datasets.filters import (
    FLAGGED_CHOICES,
    FORMATS,
    MAX_HISTORY_FRAMES,
    DatasetFilters,
    ExportOptions,
    FilterError,
    check_references,
)
from datasets.models import Dataset
from rollouts.crafter_env import ACHIEVEMENTS
from rollouts.models import RolloutBatch

_ACHIEVEMENT_CHOICES = [(a, a) for a in ACHIEVEMENTS]


class DatasetForm(forms.Form):
    name = forms.CharField(max_length=200)
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    batches = forms.TypedMultipleChoiceField(coerce=int, required=False)
    models = forms.MultipleChoiceField(required=False)
    policies = forms.MultipleChoiceField(required=False, choices=RolloutBatch.Policy.choices)
    require_achievements = forms.MultipleChoiceField(
        required=False, choices=_ACHIEVEMENT_CHOICES, label="Required achievements"
    )
    exclude_achievements = forms.MultipleChoiceField(
        required=False, choices=_ACHIEVEMENT_CHOICES, label="Excluded achievements"
    )
    min_unique = forms.IntegerField(
        required=False, min_value=0, max_value=len(ACHIEVEMENTS), label="Min unique achievements"
    )
    min_reward = forms.FloatField(required=False, label="Min episode reward")
    user_image = forms.BooleanField(required=False, label="User image present")
    include_assistant = forms.BooleanField(required=False, label="Assistant image present")
    flagged = forms.ChoiceField(choices=[(c, c) for c in FLAGGED_CHOICES], initial="any")
    exclude_errors = forms.BooleanField(required=False, label="Exclude turns with errors")
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
        min_value=0, max_value=MAX_HISTORY_FRAMES, initial=0, required=False
    )
    format = forms.ChoiceField(choices=[(f, f) for f in FORMATS], initial="studio")
    val_fraction = forms.FloatField(
        min_value=0.0, max_value=0.99, initial=0.0, required=False, label="Validation fraction"
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["batches"].choices = [
            (b.id, f"#{b.id} {b.name or b.policy} ({b.policy})")
            for b in RolloutBatch.objects.order_by("-id")
        ]
        models = sorted(set(RolloutBatch.objects.exclude(model="").values_list("model", flat=True)))
        self.fields["models"].choices = [(m, m) for m in models]
        self._filters: DatasetFilters | None = None
        self._options: ExportOptions | None = None

    @classmethod
    def for_dataset(cls, dataset: Dataset, data: Any = None) -> DatasetForm:
        initial = {
            "name": dataset.name,
            "description": dataset.description,
            **DatasetFilters.from_json(dataset.filters).to_json(),
            **ExportOptions.from_json(dataset.export_options).to_json(),
        }
        return cls(data=data, initial=initial)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.errors:
            return data
        try:
            self._filters = DatasetFilters(
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
                relabeled=data.get("relabeled") or "any",
                include_fork_prefix=bool(data.get("include_fork_prefix")),
            )
            self._options = ExportOptions(
                history_frames=data.get("history_frames") or 0,
                format=data.get("format") or "studio",
                val_fraction=data.get("val_fraction") or 0.0,
            )
            check_references(self._filters)
        except FilterError as exc:
            raise forms.ValidationError(str(exc)) from exc
        return data

    @property
    def filters(self) -> DatasetFilters:
        assert self._filters is not None, "call is_valid() first"
        return self._filters

    @property
    def options(self) -> ExportOptions:
        assert self._options is not None, "call is_valid() first"
        return self._options


class ImportForm(forms.Form):
    file = forms.FileField(help_text="JSONL: this studio's rows, synth-ai SFT rows or OpenAI chat")
    name = forms.CharField(max_length=200, required=False)
