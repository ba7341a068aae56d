"""`python manage.py export_hf`: a Hugging Face `datasets` dataset for TRL (docs/formats.md)."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError

from curation.command_options import (
    add_filter_arguments,
    add_force_argument,
    filters_from_options,
)
from curation.exporting import ExportEmpty
from curation.hf_export import HFExportError
from curation.probe_exports import probe_set_options
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
            "--probe-set",
            type=int,
            metavar="ID",
            help="export a probe set's questions (visual question-answer rows) instead of turns",
        )
        parser.add_argument(
            "--tool-calls-as-text",
            action="store_true",
            help='the tool call as <tool_call>{"name": ..., "arguments": ...}</tool_call> text, '
            "for chat templates that drop structured tool_calls (Qwen2.5-VL's)",
        )
        add_force_argument(parser, replaces="DIR when it exists and is not empty")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["probe_set"] is not None:
            exporter, export_options = probe_set_options(options)
            export = functools.partial(exporter.hf, set_id=options["probe_set"])
        else:
            filters, export_options = filters_from_options(options)
            export = functools.partial(
                hf_export, filters=filters, tool_calls_as_text=options["tool_calls_as_text"]
            )
        output = Path(options["output"])
        if not output.parent.is_dir():
            raise usage_error(f"output: directory {str(output.parent)!r} does not exist")
        taken = output.is_symlink() or (
            output.exists() and (not output.is_dir() or any(output.iterdir()))
        )
        if taken and not options["force"]:
            raise usage_error(
                f"output: {str(output)!r} exists and is not an empty directory; "
                "pass --force to replace it"
            )
        # Replacing: the new dataset is written beside the old one, which stays whole until
        # the new one is complete (a failed export leaves it as it was).
        staging = (
            Path(tempfile.mkdtemp(prefix=".tmp-hf-force-", dir=output.parent)) if taken else None
        )
        bar = progress_bar(total=None, desc="export", unit="row")
        try:
            with bar:
                result = export(
                    options=export_options,
                    output=output if staging is None else staging / "new",
                    progress=lambda done: bar.update(done - bar.n),
                )
            if staging is not None:
                os.replace(output, staging / "old")
                os.replace(staging / "new", output)
                result = dataclasses.replace(result, path=str(output))
        except ExportEmpty as exc:
            raise CommandError(f"{exc}; nothing written", returncode=1) from exc
        except HFExportError as exc:
            raise CommandError(f"export: {exc}; nothing written", returncode=1) from exc
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
        self.stdout.write(json.dumps(result.summary()))
