"""What synth-ai's SFT loader accepts: flat tools (it refuses OpenAI's nested ones with
"tool 0 missing name"), metadata kept. It reads SFT rows only: no preference pairs."""

from __future__ import annotations

from typing import Any

from curation.row_formats.base import RowFormat, register

# synth-ai 0.2.10's SFT loader (`synth_ai.learning.sft.data`) refuses shorter conversations.
SYNTH_MIN_MESSAGES = 2


def check_row(report: Any, row: int, record: dict[str, Any]) -> None:
    """What synth-ai's SFT loader refuses, added to `report` (a curation.validation
    ProviderReport)."""
    from curation.validation import Violation

    messages = record.get("messages")
    if isinstance(messages, list) and len(messages) < SYNTH_MIN_MESSAGES:
        report.violations.append(
            Violation(row, f"{len(messages)} message(s); synth needs at least 2", report.file)
        )
    for index, tool in enumerate(record.get("tools") or []):
        name = tool.get("name") if isinstance(tool, dict) else None
        if not isinstance(name, str) or not name.strip():
            report.violations.append(Violation(row, f"tool {index} missing name", report.file))


SYNTH = register(
    RowFormat(
        name="synth",
        label="Synth",
        form_help="what synth-ai's SFT loader accepts (flat tools, metadata kept).",
        command_help="synth-ai's SFT loader: flat tools, metadata kept",
        with_metadata=True,
        tools="flat",
        for_upload=True,
        upload_check=check_row,
    )
)
