"""Streams the turns a filter selects into JSONL files: the export behind command and task.

Its parts, one job each:

- `turn_rows`: reading. Turns in export order as named rows; each episode's context.
- `export`: `export_files`, the rows built, checked and written in named steps.
- `provider_checks`: a provider's limits on built rows (openai), or a token estimate.
- `files`: writing. Files hashed as written, moved into place whole or not at all.
- `preview`: the first rows for the dataset page.
"""

from curation.exporting.export import export_count, export_files
from curation.exporting.files import ExportEmpty, ExportResult, FileResult
from curation.exporting.preview import preview_rows
from curation.exporting.provider_checks import ExportRefused

__all__ = [
    "ExportEmpty",
    "ExportRefused",
    "ExportResult",
    "FileResult",
    "export_count",
    "export_files",
    "preview_rows",
]
