"""The form behind a training job's "Evaluate": how many held-out seeds, on which endpoint,
how long each episode may last."""

from __future__ import annotations

from typing import Any

from django import forms

from evaluation.services import MAX_HELD_OUT_SEEDS
from rollouts.forms_settings import settings_form_field
from studio.endpoints import endpoint_preselected, endpoints_enabled
from studio.models import Endpoint

DEFAULT_HELD_OUT_SEEDS = 20


class EvaluateForm(forms.Form):
    count = forms.IntegerField(
        initial=DEFAULT_HELD_OUT_SEEDS,
        min_value=1,
        max_value=MAX_HELD_OUT_SEEDS,
        label="Held-out seeds",
        help_text="The smallest seeds no episode of the training data played.",
    )
    steps = settings_form_field(
        "steps", help_text="Step limit of each episode; the base model's batch uses the same."
    )
    # A choice among the endpoints an admin named, never a URL (as on the batch form).
    endpoint = forms.ModelChoiceField(
        queryset=Endpoint.objects.none(),
        to_field_name="name",
        empty_label="(choose)",
        help_text="The model server that serves the fine-tuned model.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["endpoint"]
        field.queryset = endpoints_enabled(kind=Endpoint.Kind.CHAT)
        field.initial = endpoint_preselected(kind=Endpoint.Kind.CHAT)
