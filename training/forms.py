"""The submission form: builds the same `Submission` the command builds."""

from __future__ import annotations

import re
from typing import Any

from django import forms

from curation.models import DatasetVersion
from studio.endpoints import endpoints_enabled
from training.config import reference_text
from training.providers import PROVIDERS
from training.services import Submission, SubmissionError
from training.submission import submission_build

_LINE = re.compile(r"\(line (\d+)\)")


class VersionChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: DatasetVersion) -> str:
        return f"{obj.dataset.name} v{obj.number} ({obj.rows} rows, #{obj.id})"


def _done_versions():
    return (
        DatasetVersion.objects.filter(status=DatasetVersion.Status.DONE)
        .select_related("dataset")
        .order_by("-created_at", "-id")
    )


class TrainingJobForm(forms.Form):
    dataset_version = VersionChoiceField(queryset=_done_versions(), label="Dataset version")
    validation_version = VersionChoiceField(
        queryset=_done_versions(), required=False, label="Validation version (optional)"
    )
    provider = forms.ChoiceField(choices=[(p, p) for p in PROVIDERS], initial="synth")
    endpoint = forms.ChoiceField(
        help_text="Named by an admin; the key is read on the worker from the variable it names."
    )
    model = forms.CharField(
        required=False, max_length=200, help_text="Empty: [job] model of the config."
    )
    config = forms.CharField(
        label="Config (TOML)",
        strip=False,
        max_length=64 * 1024,
        widget=forms.Textarea(attrs={"rows": 30, "spellcheck": "false", "class": "toml"}),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("initial", {}).setdefault("config", reference_text())
        super().__init__(*args, **kwargs)
        self.fields["dataset_version"].queryset = _done_versions()
        self.fields["validation_version"].queryset = _done_versions()
        endpoints = [e for kind in PROVIDERS for e in endpoints_enabled(kind=kind)]
        self.fields["endpoint"].choices = [
            (e.name, f"{e.name} ({e.kind}, {e.base_url})") for e in endpoints
        ]
        self.endpoint_kinds = {e.name: e.kind for e in endpoints}
        self.submission: Submission | None = None
        self.config_errors: list[tuple[int | None, str]] = []

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        endpoint = data.get("endpoint")
        provider = data.get("provider")
        if endpoint and provider and self.endpoint_kinds.get(endpoint) != provider:
            self.add_error("endpoint", f"{endpoint!r} is not a {provider} endpoint")
        if self.errors or "config" not in data:
            return data
        version, validation = data.get("dataset_version"), data.get("validation_version")
        try:
            self.submission = submission_build(
                config_text=data["config"].replace("\r\n", "\n"),
                provider=provider,
                version_id=version.id if version else None,
                validation_version_id=validation.id if validation else None,
                endpoint_name=endpoint,
                model=data.get("model") or "",
            )
        except SubmissionError as exc:
            for line in exc.lines:
                match = _LINE.search(line)
                self.config_errors.append((int(match.group(1)) if match else None, line))
            self.add_error("config", f"{len(exc.lines)} problem(s): see beside the lines")
        return data

    @property
    def error_lines(self) -> list[int]:
        return sorted({line for line, _ in self.config_errors if line is not None})
