"""`python manage.py export_jsonl`: turns to multimodal JSONL (docs/formats.md)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError

from curation.command_options import (
    add_filter_arguments,
    add_force_argument,
    filters_from_options,
    refuse_existing,
)
from curation.exporting import ExportEmpty, ExportRefused, export_count
from curation.probe_exports import probe_set_options
from curation.row_formats import row_format
from curation.services import rows_export
from studio.commands import StudioCommand, progress_bar, usage_error


class Command(StudioCommand):
    help = (
        "Export turns as JSONL rows (messages, tools, metadata); the last line is a JSON "
        "summary. Exit 2 on bad input, 1 when --format openai refuses the data or when "
        "nothing matches (unless --allow-empty)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--output", required=True, metavar="PATH")
        add_filter_arguments(parser)
        parser.add_argument(
            "--probe-set",
            type=int,
            metavar="ID",
            help="export a probe set's questions (visual question-answer rows) instead of turns",
        )
        parser.add_argument(
            "--val-output", metavar="PATH", help="default: OUTPUT with .val.jsonl as suffix"
        )
        add_force_argument(parser, replaces="the output (and validation) file when it exists")

    def handle(self, *args: Any, **options: Any) -> None:
        probe_set = options["probe_set"]
        if probe_set is not None:
            exporter, export_options = probe_set_options(options)
            export = functools.partial(exporter.jsonl, set_id=probe_set)
            total = None
        else:
            filters, export_options = filters_from_options(options)
            export = functools.partial(rows_export, filters=filters)
        output = Path(options["output"])
        val_output = None
        if export_options.val_fraction > 0:
            val_output = Path(options["val_output"] or _default_val_path(output))
        elif options["val_output"]:
            raise usage_error("--val-output needs --val-fraction F (0 < F < 1)")
        for path in filter(None, (output, val_output)):
            if not path.parent.is_dir():
                raise usage_error(f"output: directory {str(path.parent)!r} does not exist")
            if path.is_dir():
                raise usage_error(f"output: {str(path)!r} is a directory")
        if val_output is not None and val_output.resolve() == output.resolve():
            raise usage_error("--val-output must differ from --output")
        refuse_existing(output, option="output", force=options["force"])
        if val_output is not None:
            refuse_existing(val_output, option="val-output", force=options["force"])

        if probe_set is None:
            total = export_count(filters)
        bar = progress_bar(total=total, desc="export", unit="row")
        try:
            with bar:
                result = export(
                    options=export_options,
                    output=output,
                    val_output=val_output,
                    progress=lambda done: bar.update(done - bar.n),
                )
        except ExportRefused as exc:
            lines = [*exc.lines(), f"{exc}; nothing written"]
            raise CommandError("\n".join(lines), returncode=1) from exc
        except ExportEmpty as exc:
            raise CommandError(f"{exc}; nothing written", returncode=1) from exc
        for warning in result.warnings():
            self.stderr.write(warning)
        summary = result.summary()
        if row_format(export_options.format).provider_limits:
            summary["validation"] = [r.summary() for r in result.reports]
        self.stdout.write(json.dumps(summary))


def _default_val_path(output: Path) -> Path:
    stem = output.name[: -len(".jsonl")] if output.name.endswith(".jsonl") else output.name
    return output.with_name(f"{stem}.val.jsonl")
