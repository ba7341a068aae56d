"""The dataset form: builds the same TurnSelection / ExportOptions the command builds."""

from __future__ import annotations

from typing import Any

from django import forms
from django.utils.functional import lazy

from curation.export_options import MAX_HISTORY_FRAMES, ExportOptions, check_combination
from curation.models import Dataset
from curation.row_formats import form_help, format_choices
from curation.selectors import dataset_save_problems
from rollouts.models import RolloutBatch
from rollouts.review.turn_selection import (
    FilterError,
    TurnSelection,
    check_references,
    filter_kind,
    filter_of,
    turn_filters,
)

_LABEL_FIELDS = ("name", "description")


class SearchableCheckboxes(forms.CheckboxSelectMultiple):
    """A checkbox list with a search box (studio.css / datasets.js): every choice visible."""

    template_name = "partials/searchable_checkboxes.html"


def dataset_filters() -> list[str]:
    """The filters a dataset's form offers (declared with `dataset`), as field names."""
    return [f.name for f, spec in turn_filters() if spec.dataset]


def _default(name: str) -> Any:
    return TurnSelection.__dataclass_fields__[name].default


def dataset_filter_field(name: str) -> forms.Field:
    """The dataset form's field of one filter, named as the filter, from its declaration.
    Batches and models are chosen among those recorded (`DatasetForm.__init__`)."""
    spec = filter_of(name)
    kind, many = filter_kind(name)
    kwargs: dict[str, Any] = {"required": spec.required}
    if spec.label:
        kwargs["label"] = spec.label
    if spec.help:
        kwargs["help_text"] = spec.help
    choices = [(c, spec.choice_label(c)) for c in spec.choices]
    if many:
        if kind is int:
            return forms.TypedMultipleChoiceField(
                coerce=int, choices=choices, widget=SearchableCheckboxes, **kwargs
            )
        return forms.MultipleChoiceField(choices=choices, widget=SearchableCheckboxes, **kwargs)
    if spec.choices:
        return forms.ChoiceField(choices=choices, initial=_default(name), **kwargs)
    if kind is bool:
        return forms.BooleanField(**kwargs)
    if kind is int:
        return forms.IntegerField(min_value=spec.minimum, max_value=spec.maximum, **kwargs)
    if kind is float:
        return forms.FloatField(min_value=spec.minimum, max_value=spec.maximum, **kwargs)
    return forms.CharField(max_length=spec.max_length, **kwargs)


def _filter_value(name: str, value: Any) -> Any:
    """What the form sent for a filter, as TurnSelection takes it; empty: the default."""
    kind, many = filter_kind(name)
    if many:
        return tuple(value or ())
    if kind is bool:
        return bool(value)
    if value in (None, ""):
        return _default(name)
    return value


class DatasetForm(forms.Form):
    """A dataset's name, its filter (a field for each filter `TurnSelection` declares with
    `dataset`, in its order, named as the filter) and its export options."""

    name = forms.CharField(max_length=200)
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
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
        choices=format_choices,
        initial="studio",
        help_text=lazy(form_help, str)(),
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
        self.fields.update({name: dataset_filter_field(name) for name in dataset_filters()})
        self.order_fields([*_LABEL_FIELDS, *dataset_filters()])
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
                **{name: _filter_value(name, data.get(name)) for name in dataset_filters()}
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
