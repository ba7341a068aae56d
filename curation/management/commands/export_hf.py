"""`python manage.py export_hf`: a Hugging Face `datasets` dataset for TRL (SPEC section 4)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError

from curation.command_options import add_filter_arguments, filters_from_options
from curation.exporting import ExportEmpty
from curation.hf_export import HFExportError
from curation.services import hf_export
from studio.commands import StudioCommand, progress_bar, usage_error


class Command(StudioCommand):
    help = (
        "Export turns (or preference pairs) as a Hugging Face dataset: parquet with images "
        "embedded, TRL's image placeholders, a dataset card. The last line is a JSON summary."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--output", required=True, metavar="DIR", help="a new directory")
        add_filter_arguments(parser, with_format=False)
        parser.add_argument(
            "--tool-calls-as-text",
            action="store_true",
            help='the tool call as <tool_call>{"name": ..., "arguments": ...}</tool_call> text, '
            "for chat templates that drop structured tool_calls (Qwen2.5-VL's)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        filters, export_options = filters_from_options(options)
        output = Path(options["output"])
        if not output.parent.is_dir():
            raise usage_error(f"output: directory {str(output.parent)!r} does not exist")
        if output.exists() and (not output.is_dir() or any(output.iterdir())):
            raise usage_error(f"output: {str(output)!r} exists and is not an empty directory")
        bar = progress_bar(total=None, desc="export", unit="row")
        try:
            with bar:
                result = hf_export(
                    filters=filters,
                    options=export_options,
                    output=output,
                    tool_calls_as_text=options["tool_calls_as_text"],
                    progress=lambda done: bar.update(done - bar.n),
                )
        except ExportEmpty as exc:
            raise CommandError(f"{exc}; nothing written", returncode=1) from exc
        except HFExportError as exc:
            raise CommandError(f"export: {exc}; nothing written", returncode=1) from exc
        self.stdout.write(json.dumps(result.summary()))
