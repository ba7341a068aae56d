"""The submission form: builds the same `Submission` the command builds."""

from __future__ import annotations

import re
from typing import Any

from django import forms

from curation.models import DatasetVersion
from curation.selectors import version_models
from studio.endpoints import endpoints_enabled
from studio.models import Endpoint
from training.config import ConfigError, config_load, reference_text
from training.providers import provider_kind, provider_kinds, provider_names
from training.services import Submission, SubmissionError
from training.submission import GRPO_NO_DATASET, config_text_is_grpo, submission_build

_LINE = re.compile(r"\(line (\d+)\)")


class VersionChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: DatasetVersion) -> str:
        return f"{obj.dataset.name} v{obj.number} ({obj.rows} rows, #{obj.id})"


class EndpointSelect(forms.Select):
    """Each option says its provider (`data-kind`): training.js lists only the endpoints of
    the provider chosen, so a provider and an endpoint of another never meet."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kinds: dict[str, str] = {}

    def create_option(self, name, value, label, selected, index, subindex=None, attrs=None):
        option = super().create_option(name, value, label, selected, index, subindex, attrs)
        kind = self.kinds.get(str(value))
        if kind:
            option["attrs"]["data-kind"] = kind
        return option


def _done_versions():
    return (
        DatasetVersion.objects.filter(status=DatasetVersion.Status.DONE)
        .select_related("dataset")
        .order_by("-created_at", "-id")
    )


def _provider_choices() -> list[tuple[str, str]]:
    # Callable: read when a form is made, so every registered provider is offered.
    return [(name, name) for name in provider_names()]


class TrainingJobForm(forms.Form):
    # Required unless the config is GRPO's ([training] mode = "grpo"): checked in `clean`.
    dataset_version = VersionChoiceField(
        queryset=_done_versions(),
        required=False,
        label="Dataset version",
        help_text='None for a GRPO config ([training] mode = "grpo"): it trains on the '
        "episodes it plays.",
    )
    validation_version = VersionChoiceField(
        queryset=_done_versions(), required=False, label="Validation version (optional)"
    )
    provider = forms.ChoiceField(choices=_provider_choices, initial="synth")
    endpoint = forms.ChoiceField(
        widget=EndpointSelect,
        required=False,
        help_text="Named by an admin; the key is read on the worker from the variable it names. "
        "None for a provider that trains on the studio's own workers (trl).",
    )
    model = forms.CharField(
        required=False,
        max_length=200,
        help_text="Empty: the model that played the dataset's turns, or [job] model of the "
        "config when no model played them. trl: the open model to start from (a directory on "
        "the train worker or a Hugging Face id), [job] model when empty.",
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
        # Each endpoint with the provider its kind serves (the page matches them by name).
        served = [
            (e, kind.name)
            for kind in provider_kinds()
            if kind.endpoint_kind
            for e in endpoints_enabled(kind=kind.endpoint_kind)
        ]
        endpoints = [e for e, _ in served]
        self.fields["endpoint"].choices = [
            (e.name, f"{e.name} ({e.kind}, {e.base_url})") for e in endpoints
        ]
        self.endpoint_kinds = {e.name: provider for e, provider in served}
        self.fields["endpoint"].widget.kinds = self.endpoint_kinds
        if not self.is_bound:
            self._initial_choices(endpoints)
        self.submission: Submission | None = None
        self.config_errors: list[tuple[int | None, str]] = []
        # What the page says of providers that run on our own workers (trl), by name.
        self.provider_notices = [(k.name, k.notice) for k in provider_kinds() if k.notice]

    def _initial_choices(self, endpoints: list[Endpoint]) -> None:
        """What a new form can choose alone: a provider that has an endpoint, its first
        endpoint, and the dataset version when there is only one."""
        provider = self.initial.get("provider") or self.fields["provider"].initial
        kinds = [self.endpoint_kinds[e.name] for e in endpoints]
        if kinds and provider not in kinds:
            provider = kinds[0]
            self.initial.setdefault("provider", provider)
        first = next((e.name for e in endpoints if self.endpoint_kinds[e.name] == provider), None)
        if first is not None:
            self.initial.setdefault("endpoint", first)
        versions = list(self.fields["dataset_version"].queryset.values_list("id", flat=True)[:2])
        grpo = config_text_is_grpo(str(self.initial.get("config", "")))
        if len(versions) == 1 and not grpo:
            self.initial.setdefault("dataset_version", versions[0])

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        endpoint = data.get("endpoint")
        provider = data.get("provider")
        remote = provider_kind(provider).needs_url if provider else True
        if not remote:
            endpoint = ""  # trained on our own workers: no endpoint, whatever was selected
        elif endpoint and provider and self.endpoint_kinds.get(endpoint) != provider:
            self.add_error("endpoint", f"{endpoint!r} is not a {provider} endpoint")
        elif provider and not endpoint:
            self.add_error("endpoint", f"the {provider} provider needs an endpoint")
        if "config" not in data:
            return data
        version, validation = data.get("dataset_version"), data.get("validation_version")
        self._dataset_checks(config_text_is_grpo(data["config"]), version, validation)
        # A local run fine-tunes an open model, never the hosted one that played the turns.
        recorded = self._recorded_model(version) if version and remote else ""
        model = data.get("model") or recorded
        if self.errors:
            # Another field is wrong: the config is still checked on its own, so that its
            # errors stay beside their lines until they are fixed.
            try:
                config_load(data["config"].replace("\r\n", "\n"))
            except ConfigError as exc:
                self._config_refused(exc.lines())
            return data
        try:
            self.submission = submission_build(
                config_text=data["config"].replace("\r\n", "\n"),
                provider=provider,
                version_id=version.id if version else None,
                validation_version_id=validation.id if validation else None,
                endpoint_name=endpoint,
                model=model,
            )
        except SubmissionError as exc:
            self._config_refused(exc.lines)
        return data

    def _dataset_checks(self, grpo: bool, version, validation) -> None:
        """A dataset version for every job but a GRPO one, which takes none."""
        if not grpo:
            if version is None and "dataset_version" not in self.errors:
                self.add_error(
                    "dataset_version",
                    'This field is required (only a GRPO config, [training] mode = "grpo", '
                    "takes none).",
                )
            return
        if version is not None:
            self.add_error("dataset_version", f"{GRPO_NO_DATASET}: choose none")
        if validation is not None:
            self.add_error("validation_version", f"{GRPO_NO_DATASET}: choose none")

    def _recorded_model(self, version: DatasetVersion) -> str:
        """The model whose games the version holds, to fine-tune when Model is left empty:
        improving the model that played is the loop the studio is for. Several models: no
        guess (a billed job on the wrong base model costs more than naming one), an error
        naming them. None (scripted, random or people's games): "" for the config's."""
        models = version_models(version=version)
        if len(models) > 1:
            shown = ", ".join(models[:5]) + (
                f" and {len(models) - 5} more" if len(models) > 5 else ""
            )
            self.add_error(
                "model",
                f"the dataset's turns were played by {len(models)} models ({shown}): "
                "name the one to fine-tune",
            )
            return ""
        return models[0] if models else ""

    def _config_refused(self, lines: list[str]) -> None:
        for line in lines:
            match = _LINE.search(line)
            self.config_errors.append((int(match.group(1)) if match else None, line))
        self.add_error("config", f"{len(lines)} problem(s): see beside the lines")

    @property
    def field_errors(self) -> list[tuple[str, str]]:
        """(field label or "", message) of the errors not listed as config problems: the
        side panel shows them too, as a live check replaces only the panel."""
        found: list[tuple[str, str]] = []
        for name, errors in self.errors.items():
            if name == "config" and self.config_errors:
                continue
            label = str(self[name].label) if name in self.fields else ""
            found.extend((label, str(error)) for error in errors)
        return found

    @property
    def error_lines(self) -> list[int]:
        return sorted({line for line, _ in self.config_errors if line is not None})
