"""`python manage.py import_jsonl PATH [--name NAME]`: rows in, as imported turns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError

from curation.importing import ImportFailed, import_file
from studio.commands import StudioCommand, progress_bar, usage_error


class Command(StudioCommand):
    help = (
        "Import JSONL rows (this studio's, synth-ai's SFT rows or OpenAI chat rows) as a "
        "dataset of imported turns, all or nothing; the last line is a JSON summary."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("path", metavar="PATH")
        parser.add_argument("--name", default="", help="name of the batch and dataset")
        parser.add_argument(
            "--skip-existing",
            action="store_true",
            help="leave out rows whose turns are already in the studio (default: refuse the file)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        path = Path(options["path"])
        if not path.is_file():
            raise usage_error(f"path: {str(path)!r} is not a file")
        checking = progress_bar(total=path.stat().st_size, desc="checking", unit="B")
        writing = progress_bar(total=0, desc="writing", unit="line")

        def checked(done: int) -> None:
            checking.update(done - checking.n)

        def planned(lines: int) -> None:
            checking.close()
            writing.reset(total=lines)

        try:
            with checking, writing:
                summary = import_file(
                    path=path,
                    name=options["name"],
                    skip_existing=options["skip_existing"],
                    on_checked=checked,
                    on_planned=planned,
                    on_written=lambda done: writing.update(done - writing.n),
                )
        except ImportFailed as exc:
            raise CommandError("\n".join([*exc.errors, str(exc)]), returncode=1) from exc
        self.stdout.write(json.dumps(summary))
