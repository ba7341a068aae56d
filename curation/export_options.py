"""A dataset's export options (what rows look like, not which turns): one object for the
command, the pages and the export. Which turns is `rollouts.review.turn_selection.TurnSelection`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from curation.row_formats import find_format, format_names, row_format
from rollouts.review.turn_selection import (
    FilterError,
    TurnSelection,
    options_from_json,
    options_to_json,
)

# sft: one row per turn; preference: one row per pair of same-state answers (curation.preferences)
KINDS = ("sft", "preference")
MAX_HISTORY_FRAMES = 9  # the current frame plus 9 is the provider's 10 images per row


@dataclass(frozen=True)
class ExportOptions:
    history_frames: int = 0
    format: str = "studio"
    val_fraction: float = 0.0
    # An export that selects nothing is an error (a filter typo, not a dataset) unless asked.
    allow_empty: bool = False
    kind: str = "sft"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if not 0 <= self.history_frames <= MAX_HISTORY_FRAMES:
            raise FilterError(
                f"history-frames: {self.history_frames} is not between 0 and {MAX_HISTORY_FRAMES}"
            )
        if find_format(self.format) is None:
            names = ", ".join(format_names())
            raise FilterError(f"format: {self.format!r} is not one of {names}")
        if self.kind not in KINDS:
            raise FilterError(f"kind: {self.kind!r} is not one of {', '.join(KINDS)}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise FilterError(f"val-fraction: {self.val_fraction} is not in [0, 1)")

    def to_json(self) -> dict[str, Any]:
        return options_to_json(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> ExportOptions:
        return options_from_json(cls, data or {})


def check_combination(filters: TurnSelection, options: ExportOptions) -> None:
    """Options that are valid alone but not together, as the row format declares them."""
    declared = row_format(options.format)
    if options.kind == "preference" and declared.preference_rows is None:
        writers = " or ".join(format_names(preference=True))
        raise FilterError(
            f"kind: preference rows are written in the {writers} format, not {declared.name}"
        )
    if filters.include_text_fallback and not declared.with_metadata:
        # Without metadata the inferred tool call could not be marked as inferred.
        raise FilterError(
            f"include-text-fallback: the {declared.name} format has no metadata to mark "
            "text-fallback turns; use the studio format or leave them out"
        )
