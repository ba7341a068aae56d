"""Export row formats, each declared once: one module per format, read by everything else.

The forms' choices, `export_jsonl --format`, validation of export options, the provider
checks of an export, preference rows, the versions table and training uploads all ask a
`RowFormat` here rather than compare its name. Adding a format is one module in this package
and one import line at the bottom of this file (docs/layout.md, "How to add a row format").

Pure Python, no Django: `curation.jsonl` reads it.
"""

from __future__ import annotations

from curation.row_formats.base import (
    RowCheck,
    RowFormat,
    ToolShape,
    command_help,
    find_format,
    form_help,
    format_choices,
    format_names,
    register,
    row_format,
    row_formats,
    unregister,
)

__all__ = [
    "RowCheck",
    "RowFormat",
    "ToolShape",
    "command_help",
    "find_format",
    "form_help",
    "format_choices",
    "format_names",
    "register",
    "row_format",
    "row_formats",
    "unregister",
]

# The formats: registered as imported, the order the form and `--format` list them.
# isort: off
from curation.row_formats import studio  # noqa: F401
from curation.row_formats import openai  # noqa: F401
from curation.row_formats import synth  # noqa: F401
# isort: on
