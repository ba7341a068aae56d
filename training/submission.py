"""Building a checked `Submission` from what the CLI or the form gives: one path for both.

Nothing is written here: a bad version, a config error or an unknown endpoint is a
SubmissionError with one line per problem, each config error naming its key and line.
"""

from __future__ import annotations

import tomllib
from typing import Any

from curation.models import Dataset, DatasetVersion
from studio.endpoints import EndpointError
from training.config import (
    MAX_TOML_CHARS,
    ConfigError,
    TrainingConfig,
    config_is_grpo,
    config_load,
)
from training.providers import ProviderKind, provider_kinds, provider_names
from training.services import Submission, SubmissionError, endpoint_target
from training.toml_shape import toml_shape_problem


def version_done(version_id: int, *, what: str = "dataset version") -> DatasetVersion:
    version = DatasetVersion.objects.select_related("dataset").filter(id=version_id).first()
    if version is None:
        raise SubmissionError([f"{what}: no dataset version {version_id}"])
    if version.status != DatasetVersion.Status.DONE:
        raise SubmissionError(
            [f"{what}: version {version_id} is {version.status}, not done; export it first"]
        )
    return version


def dataset_newest_version(dataset_id: int) -> DatasetVersion | None:
    return (
        DatasetVersion.objects.select_related("dataset")
        .filter(dataset_id=dataset_id, status=DatasetVersion.Status.DONE)
        .order_by("-number")
        .first()
    )


def _resolve_reference(value: Any) -> DatasetVersion | str:
    """A `[job] data` / `[data] validation_path` value: a version id or a dataset's name."""
    if isinstance(value, int):
        version = DatasetVersion.objects.filter(id=value).first()
        if version is None:
            return f"no dataset version {value}"
        if version.status != DatasetVersion.Status.DONE:
            return f"dataset version {value} is {version.status}, not done"
        return version
    text = str(value).strip()
    if text.isdigit():
        return _resolve_reference(int(text))
    dataset = Dataset.objects.filter(name=text).order_by("-id").first()
    if dataset is None:
        return f"unknown dataset {text!r} (give a dataset version id or a dataset's name)"
    version = dataset_newest_version(dataset.id)
    if version is None:
        return f"dataset {text!r} has no finished version"
    return version


def config_text_is_grpo(text: str) -> bool:
    """Whether a TOML text asks for GRPO, read before anything is checked (so that no
    dataset is exported for a job that takes none); False for a text that is not TOML, or
    whose shape is out of bounds (its reading, `config_load`, says so)."""
    if len(text) > MAX_TOML_CHARS or toml_shape_problem(text) is not None:
        return False
    try:
        return config_is_grpo(tomllib.loads(text))
    except (tomllib.TOMLDecodeError, RecursionError, ValueError):
        return False


# What a GRPO config is told when it is given a dataset: one line.
GRPO_NO_DATASET = "a GRPO job trains on the episodes it plays, not on a dataset version"


def _grpo_checks(
    kind: ProviderKind, config: TrainingConfig, *, version_id: int | None, validation_id: int | None
) -> None:
    """A GRPO config ([training] mode = "grpo"): played on our own train workers, so only a
    provider that trains on them runs it; and it takes no dataset, validation or not."""
    mode_line = config.line_of("training", "mode")
    where = f"[training] mode{f' (line {mode_line})' if mode_line else ''}"
    if kind.needs_url:
        local = ", ".join(k.name for k in provider_kinds() if not k.needs_url) or "none"
        raise SubmissionError(
            [
                f'{where}: "grpo" plays Crafter on the studio\'s own train workers; the '
                f"{kind.name} provider cannot run it (providers that can: {local})"
            ]
        )
    lines = []
    if version_id is not None:
        lines.append(f"dataset version: {GRPO_NO_DATASET}; give none")
    if validation_id is not None:
        lines.append(f"validation version: {GRPO_NO_DATASET}; give none")
    for section, key in (("job", "data"), ("data", "validation_path")):
        if config.get(section, key) is not None:
            line = config.line_of(section, key)
            lines.append(
                f"[{section}] {key}{f' (line {line})' if line else ''}: {GRPO_NO_DATASET}; "
                "remove it"
            )
    if lines:
        raise SubmissionError(lines)


def _kind_checks(kind: ProviderKind, config: TrainingConfig, versions: list) -> None:
    """What the provider itself refuses: settings it cannot honour (one line each), a version
    without the Hugging Face export it trains on."""
    lines = list(kind.refusals(config.sections)) if kind.refusals is not None else []
    if not kind.uploads_files:
        lines += [
            f"dataset version {v.id}: no Hugging Face export (made by versions exported since "
            "it exists); export the dataset again"
            for v in versions
            if v is not None and not (v.hf_file and v.hf_sha256)
        ]
    if lines:
        raise SubmissionError(lines)


def _target(kind: ProviderKind, *, base_url: str, endpoint_name: str) -> tuple[str, str]:
    """(base URL, key variable): an admin-named endpoint's, or the command line's."""
    api_key_env = kind.key_env
    if endpoint_name:
        try:
            base_url, api_key_env = endpoint_target(name=endpoint_name, provider=kind.name)
        except EndpointError as exc:
            raise SubmissionError([str(exc)]) from None
    else:
        base_url = base_url or kind.default_url()
        if not base_url:
            raise SubmissionError(
                [
                    f"base URL: give --base-url or set {kind.url_setting} "
                    f"for the {kind.name} provider"
                ]
            )
    if not base_url.startswith(("http://", "https://")):
        raise SubmissionError([f"base URL: {base_url!r} is not an http(s) URL"])
    return base_url, api_key_env


def submission_build(
    *,
    config_text: str,
    provider: str = "synth",
    version_id: int | None = None,
    validation_version_id: int | None = None,
    base_url: str = "",
    endpoint_name: str = "",
    model: str = "",
) -> Submission:
    kind = next((k for k in provider_kinds() if k.name == provider), None)
    if kind is None:
        names = ", ".join(provider_names())
        raise SubmissionError([f"provider: {provider!r} is not one of {names}"])
    if config_text_is_grpo(config_text):
        try:
            config = config_load(config_text)
        except ConfigError as exc:
            raise SubmissionError(exc.lines()) from None
        _grpo_checks(kind, config, version_id=version_id, validation_id=validation_version_id)
        _kind_checks(kind, config, [])
        return _submission(kind, config, config_text, base_url, endpoint_name, model)
    version = version_done(version_id) if version_id is not None else None
    validation = (
        version_done(validation_version_id, what="validation version")
        if validation_version_id is not None
        else None
    )
    resolved: dict[str, DatasetVersion] = {}

    def resolve(section: str, key: str, value: Any) -> str | None:
        # Checked even when the command line or the form names a version (which wins):
        # a reference to nothing is a mistake worth a word.
        found = _resolve_reference(value)
        if isinstance(found, str):
            return found
        resolved[section] = found
        return None

    try:
        config = config_load(config_text, resolve_dataset=resolve)
    except ConfigError as exc:
        raise SubmissionError(exc.lines()) from None
    version = version or resolved.get("job")
    validation = validation or resolved.get("data")
    if version is None:
        line = config.line_of("job")
        raise SubmissionError(
            [
                f"[job] data{f' (line {line})' if line else ''}: missing dataset; give "
                "--dataset-version, --dataset or [job] data = <version id>"
            ]
        )
    if validation is not None and validation.id == version.id:
        raise SubmissionError(["validation version: the same version as the training data"])

    _kind_checks(kind, config, [version, validation])
    return _submission(
        kind, config, config_text, base_url, endpoint_name, model, version, validation
    )


def _submission(
    kind: ProviderKind,
    config: TrainingConfig,
    config_text: str,
    base_url: str,
    endpoint_name: str,
    model: str,
    version: DatasetVersion | None = None,
    validation: DatasetVersion | None = None,
) -> Submission:
    """The checked submission: where it goes (no URL for our own workers) and with what."""
    if not kind.needs_url:
        # Trained on our own workers: no URL, no key, no endpoint.
        base_url, api_key_env, endpoint_name = kind.default_url(), "", ""
    else:
        base_url, api_key_env = _target(kind, base_url=base_url, endpoint_name=endpoint_name)
    return Submission(
        version=version,
        validation_version=validation,
        config=config,
        config_text=config_text,
        provider=kind.name,
        base_url=base_url.rstrip("/"),
        api_key_env=api_key_env,
        endpoint_name=endpoint_name,
        model=(model or config.model).strip(),
    )
