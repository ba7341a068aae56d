"""Imports JSONL rows (ours, synth-ai's SFT rows, plain OpenAI chat rows) as imported turns.

Two passes over the file. The first checks every line (JSON, roles, content parts, tool
calls, every image decoded by Pillow under byte and pixel limits) and collects the errors
with their line numbers; nothing is written unless all lines pass. The second writes, in one
transaction: a `RolloutBatch(policy="imported")`, one `Episode` per episode found (seed = its
position in the import), frames (PNG files by sha256, written only now), turns and a dataset
selecting the batch. Imported turns are then reviewed, flagged and exported like recorded
ones; their request is kept as sent, images referring to stored frames by step.

Episodes: rows whose metadata has `episode_id` (our format) are grouped by
(`batch_id`, `episode_id`), rows with a synth-ai `session_id` by that; any other row is an
episode of its own. Turn indices come from `metadata.turn` when they are distinct within the
episode, else from the order of the lines.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings as django_settings

from curation.importing.checking import ImportFailed, check_file
from curation.importing.writing import write_import

__all__ = ["ImportFailed", "import_file"]


def import_file(
    *,
    path: str | Path,
    name: str = "",
    source_name: str = "",
    created_by=None,
    skip_existing: bool = False,
    on_checked: Callable[[int], None] | None = None,
    on_planned: Callable[[int], None] | None = None,
    on_written: Callable[[int], None] | None = None,
    finish: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Check, then import all or nothing; returns the summary the command prints.

    `source_name` is the file's name as the user knows it (an upload is read from where it
    was stored): the dataset is named after it unless `name` is given.

    Progress: `on_checked(bytes read)` during the check, `on_planned(lines to write)` once
    every line passed, then `on_written(lines written)`. `finish(summary)` runs in the
    write transaction (see write_import).
    """
    path = Path(path)
    plan = check_file(
        path,
        skip_existing=skip_existing,
        max_line_bytes=django_settings.STUDIO_IMPORT_MAX_LINE_BYTES,
        progress=on_checked,
    )
    if on_planned is not None:
        on_planned(plan.lines - len(plan.skipped))
    source = source_name or path.name
    try:
        return write_import(
            path,
            plan,
            name=name or source,
            source_name=source,
            created_by=created_by,
            progress=on_written,
            finish=finish,
        )
    except OSError as exc:
        # The file passed; storage did not (disk full, a path taken). Nothing was kept.
        reason = exc.strerror or type(exc).__name__
        raise ImportFailed([f"storage refused a frame: {reason}"], 1) from None
