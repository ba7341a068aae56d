"""The `RowFormat` declaration and its registry (the package's `__init__` loads the formats).

Pure Python, no Django.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

# How a row's tools are written: as recorded (OpenAI's nested shape), nested even when a
# stored row has flat ones, or flat (`{"name", "description", "parameters"}`).
ToolShape = Literal["recorded", "nested", "flat"]
# A row check beyond the shared limits: (report, row number, row) -> adds violations.
RowCheck = Callable[[Any, int, dict[str, Any]], None]


@dataclass(frozen=True)
class RowFormat:
    """What an export row format is: everything the studio asks of it."""

    name: str
    label: str  # in the dataset form's choice list
    form_help: str  # one sentence after "Label: " in the form's help
    command_help: str  # in parentheses after the name in `--format`'s help
    with_metadata: bool  # rows carry the studio's "metadata" object
    tools: ToolShape = "recorded"
    # Rows are checked against OpenAI fine-tuning's limits (images, sizes, at least
    # `min_train_rows` rows in the training file); otherwise only estimated.
    provider_limits: bool = False
    min_train_rows: int = 0
    # How preference pairs are written: "openai" (OpenAI's DPO rows), "trl" (TRL's
    # prompt/chosen/rejected with metadata) or None (preference exports are refused).
    preference_rows: Literal["openai", "trl"] | None = None
    # A training provider may receive rows in this format (`row_for_provider`).
    for_upload: bool = False
    # The version's own file is the Hugging Face dataset's source (else it is exported
    # again in the studio format, which carries metadata).
    hf_as_written: bool = False
    # How the versions table names it (default: the name).
    listed_as: str = ""
    # A check of each uploaded row beyond the shared limits (what the provider's loader
    # refuses), or None.
    upload_check: RowCheck | None = None

    @property
    def shown(self) -> str:
        return self.listed_as or self.name


_FORMATS: dict[str, RowFormat] = {}


def register(row_format: RowFormat) -> RowFormat:
    """Add a format (a module's one call); the order of registration is the order shown."""
    if row_format.name in _FORMATS:
        raise ValueError(f"row format {row_format.name!r} is registered twice")
    _FORMATS[row_format.name] = row_format
    return row_format


def unregister(name: str) -> None:
    """Remove a format (tests that register a throwaway one)."""
    _FORMATS.pop(name, None)


def row_formats() -> tuple[RowFormat, ...]:
    return tuple(_FORMATS.values())


def format_names(*, preference: bool = False, upload: bool = False) -> tuple[str, ...]:
    """Names of the formats, in order; only those that write preference rows or that a
    provider may receive when asked."""
    return tuple(
        f.name
        for f in _FORMATS.values()
        if (not preference or f.preference_rows) and (not upload or f.for_upload)
    )


def format_choices() -> list[tuple[str, str]]:
    """(name, label) for a form's choice list; callable, so a new format shows at once."""
    return [(f.name, f.label) for f in _FORMATS.values()]


def find_format(name: str) -> RowFormat | None:
    return _FORMATS.get(name)


def row_format(name: str) -> RowFormat:
    """The format called `name`; ValueError naming the registered ones otherwise."""
    found = _FORMATS.get(name)
    if found is None:
        raise ValueError(f"format {name!r} is not one of {format_names()}")
    return found


def form_help() -> str:
    return " ".join(f"{f.label}: {f.form_help}" for f in _FORMATS.values())


def command_help() -> str:
    """`--format`'s help: "a (...), b (...) or c (...)"."""
    parts = [f"{f.name} ({f.command_help})" for f in _FORMATS.values()]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]
