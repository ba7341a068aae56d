"""`python manage.py export_jsonl`: turns to multimodal JSONL (SPEC sections 4 and 5)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError

from datasets.exporting import ExportEmpty, ExportRefused, export_count, export_files
from datasets.filters import (
    FLAGGED_CHOICES,
    FORMATS,
    RELABELED_CHOICES,
    DatasetFilters,
    ExportOptions,
    FilterError,
    check_combination,
    check_references,
)
from datasets.models import Dataset
from studio.commands import StudioCommand, progress_bar, usage_error

_FILTER_FLAGS = (
    "batch",
    "model",
    "require_achievement",
    "exclude_achievement",
    "min_unique",
    "min_reward",
    "user_image",
    "include_assistant",
    "flagged",
    "include_text_fallback",
    "relabeled",
    "include_fork_prefix",
)


class Command(StudioCommand):
    help = (
        "Export turns as JSONL rows (messages, tools, metadata); the last line is a JSON "
        "summary. Exit 2 on bad input, 1 when --format openai refuses the data or when "
        "nothing matches (unless --allow-empty)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--output", required=True, metavar="PATH")
        parser.add_argument("--dataset", type=int, metavar="ID", help="use a saved dataset")
        parser.add_argument("--batch", type=int, nargs="+", action="extend", metavar="ID")
        parser.add_argument("--model", nargs="+", action="extend", metavar="M")
        parser.add_argument("--require-achievement", nargs="+", action="extend", metavar="A")
        parser.add_argument("--exclude-achievement", nargs="+", action="extend", metavar="A")
        parser.add_argument("--min-unique", type=int, metavar="N")
        parser.add_argument("--min-reward", type=float, metavar="X")
        parser.add_argument(
            "--user-image", action="store_true", default=None, help="rows with a user image"
        )
        parser.add_argument(
            "--include-assistant",
            action="store_true",
            default=None,
            help="rows whose assistant messages hold an image as well (synth-ai's flag)",
        )
        parser.add_argument("--flagged", choices=FLAGGED_CHOICES)
        parser.add_argument(
            "--include-text-fallback",
            action="store_true",
            default=None,
            help="also turns whose actions were read from the model's prose (left out by "
            "default: the model made no tool call); marked metadata.text_fallback",
        )
        parser.add_argument(
            "--allow-empty",
            action="store_true",
            help="write the file even when no row matches (otherwise exit 1, nothing written)",
        )
        parser.add_argument(
            "--relabeled",
            choices=RELABELED_CHOICES,
            help="turns a reviewer corrected: any (default), only them, or none of them",
        )
        parser.add_argument(
            "--include-fork-prefix",
            action="store_true",
            default=None,
            help="also export the turns a fork replays from its original",
        )
        parser.add_argument("--val-fraction", type=float, metavar="F")
        parser.add_argument(
            "--val-output", metavar="PATH", help="default: OUTPUT with .val.jsonl as suffix"
        )
        parser.add_argument("--history-frames", type=int, metavar="K")
        parser.add_argument(
            "--format",
            choices=FORMATS,
            help="studio (rows with metadata; default), openai (what OpenAI fine-tuning "
            "accepts) or synth (synth-ai's SFT loader: flat tools, metadata kept)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        filters, export_options = self._filters(options)
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

        total = export_count(filters)
        bar = progress_bar(total=total, desc="export", unit="row")
        try:
            with bar:
                result = export_files(
                    filters=filters,
                    options=export_options,
                    output=output,
                    val_output=val_output,
                    progress=lambda done: bar.update(done - bar.n),
                )
        except ExportRefused as exc:
            for line in exc.lines():
                self.stderr.write(line)
            raise CommandError(f"{exc}; nothing written", returncode=1) from exc
        except ExportEmpty as exc:
            raise CommandError(f"{exc}; nothing written", returncode=1) from exc
        for warning in result.warnings():
            self.stderr.write(warning)
        summary = result.summary()
        if export_options.format == "openai":
            summary["validation"] = [r.summary() for r in result.reports]
        self.stdout.write(json.dumps(summary))

    def _filters(self, options: dict[str, Any]) -> tuple[DatasetFilters, ExportOptions]:
        try:
            if options["dataset"] is not None:
                given = [f for f in _FILTER_FLAGS if options[f] is not None]
                if given:
                    flag = "--" + given[0].replace("_", "-")
                    raise usage_error(
                        f"{flag}: --dataset uses the dataset's saved filters; edit the dataset "
                        "or export without --dataset"
                    )
                dataset = Dataset.objects.filter(id=options["dataset"]).first()
                if dataset is None:
                    raise usage_error(f"dataset: there is no dataset {options['dataset']}")
                filters = DatasetFilters.from_json(dataset.filters)
                saved = ExportOptions.from_json(dataset.export_options)
            else:
                filters = DatasetFilters(
                    batches=tuple(options["batch"] or ()),
                    models=tuple(options["model"] or ()),
                    require_achievements=tuple(options["require_achievement"] or ()),
                    exclude_achievements=tuple(options["exclude_achievement"] or ()),
                    min_unique=options["min_unique"],
                    min_reward=options["min_reward"],
                    user_image=bool(options["user_image"]),
                    include_assistant=bool(options["include_assistant"]),
                    flagged=options["flagged"] or "any",
                    include_text_fallback=bool(options["include_text_fallback"]),
                    relabeled=options["relabeled"] or "any",
                    include_fork_prefix=bool(options["include_fork_prefix"]),
                )
                saved = ExportOptions()
            # Flags given on the command line override the dataset's saved export options.
            export_options = ExportOptions(
                history_frames=_given(options["history_frames"], saved.history_frames),
                format=_given(options["format"], saved.format),
                val_fraction=_given(options["val_fraction"], saved.val_fraction),
                allow_empty=options["allow_empty"] or saved.allow_empty,
            )
            check_references(filters)
            check_combination(filters, export_options)
        except FilterError as exc:
            raise usage_error(str(exc)) from exc
        return filters, export_options


def _given(value: Any, default: Any) -> Any:
    return default if value is None else value


def _default_val_path(output: Path) -> Path:
    stem = output.name[: -len(".jsonl")] if output.name.endswith(".jsonl") else output.name
    return output.with_name(f"{stem}.val.jsonl")
