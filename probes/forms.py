"""Forms of the probe pages: a set built from a batch or a dataset's filters, a run of a set
on an admin-named endpoint, a reviewer's flag and note on an answer, the answer list's view."""

from __future__ import annotations

from typing import Any

from django import forms

from curation.models import Dataset
from probes.models import ProbeRun
from probes.questions import kind_names
from rollouts.models import RolloutBatch
from rollouts.review.services import NOTE_MAX_LENGTH
from rollouts.review.turn_selection import BIGINT_MAX, TurnSelection
from studio.endpoints import endpoint_preselected, endpoints_enabled
from studio.models import Endpoint

# Bounds a person meets in a form; the command takes the same (probes.services checks them).
PER_EPISODE_MAX = 10_000
CONCURRENCY_MAX = 256


class ProbeSetForm(forms.Form):
    """Which frames (a batch, or a saved dataset's filters) and which questions on them."""

    name = forms.CharField(max_length=200, required=False)
    batch = forms.TypedChoiceField(
        coerce=int,
        required=False,
        empty_value=None,
        label="From a batch",
        help_text="Every recorded frame of the batch that has a turn with a text observation.",
    )
    dataset = forms.TypedChoiceField(
        coerce=int,
        required=False,
        empty_value=None,
        label="Or a dataset's turns",
        help_text="The frames of the turns its saved filters select.",
    )
    kinds = forms.MultipleChoiceField(
        choices=(),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Empty: every kind.",
    )
    per_episode = forms.IntegerField(
        min_value=1,
        max_value=PER_EPISODE_MAX,
        required=False,
        # A set is built in the request: a sample keeps a long batch's set to seconds.
        initial=20,
        label="Frames per episode",
        help_text="A seeded sample of N frames of each episode; empty: every frame.",
    )
    seed = forms.IntegerField(
        min_value=0,
        max_value=BIGINT_MAX,
        initial=0,
        required=False,
        help_text="The same frames and seed give the same questions and choices.",
    )
    balance = forms.BooleanField(
        required=False,
        label="Balance the answers",
        help_text="Evens each kind's right answers (see docs/probes.md).",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["kinds"].choices = [(k, k) for k in kind_names()]
        self.fields["batch"].choices = [("", "—")] + [
            (b.id, f"#{b.id} {b.name or b.policy} ({b.policy}{', ' + b.model if b.model else ''})")
            for b in RolloutBatch.objects.order_by("-id")[:500]
        ]
        self.fields["dataset"].choices = [("", "—")] + [
            (d.id, f"#{d.id} {d.name}") for d in Dataset.objects.order_by("-id")[:500]
        ]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        batch, dataset = data.get("batch"), data.get("dataset")
        if self.errors:
            return data
        if (batch is None) == (dataset is None):
            raise forms.ValidationError("Pick a batch or a dataset (one of them).")
        return data

    @property
    def selection(self) -> TurnSelection:
        """The frames' turns, as the dataset filters say them; after is_valid()."""
        data = self.cleaned_data
        if data.get("batch") is not None:
            return TurnSelection(batches=(data["batch"],))
        return TurnSelection.from_json(Dataset.objects.get(id=data["dataset"]).filters)


class ProbeRunForm(forms.Form):
    """A run of a set: the endpoint among those an admin named (never a URL), the model, and
    what the question comes with (the frame, its text observation, or nothing)."""

    endpoint = forms.ModelChoiceField(
        queryset=Endpoint.objects.none(),
        to_field_name="name",
        empty_label="(choose)",
        help_text="A model server an admin named under /admin/.",
    )
    model = forms.CharField(max_length=200)
    observation = forms.ChoiceField(
        choices=ProbeRun.Observation.choices,
        initial=ProbeRun.Observation.IMAGE,
        help_text="Text and none are controls: what the image itself adds is the difference.",
    )
    concurrency = forms.IntegerField(
        min_value=1,
        max_value=CONCURRENCY_MAX,
        required=False,
        help_text="Most requests in flight to the endpoint; empty: the endpoint's default.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["endpoint"]
        field.queryset = endpoints_enabled(kind=Endpoint.Kind.CHAT)
        field.initial = endpoint_preselected(kind=Endpoint.Kind.CHAT)


class FlagForm(forms.Form):
    """The wanted state, not a toggle: sending it twice changes nothing the second time."""

    flagged = forms.TypedChoiceField(
        choices=[("1", "flag"), ("0", "unflag")], coerce=lambda v: v == "1"
    )


class NoteForm(forms.Form):
    note = forms.CharField(required=False, max_length=NOTE_MAX_LENGTH, strip=True)
