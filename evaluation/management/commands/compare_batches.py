"""`python manage.py compare_batches A B [C ...] [--json]`: batches side by side on shared seeds."""

from __future__ import annotations

import json
from typing import Any

from evaluation import selectors
from evaluation.reports import comparison_json, comparison_table
from studio.commands import StudioCommand, usage_error


class Command(StudioCommand):
    help = (
        "Batches side by side on the seeds they share, with 95% intervals, and the paired "
        "difference of each against the first."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("batch_ids", nargs="+", type=int, metavar="BATCH")
        parser.add_argument("--json", action="store_true", help="one JSON object instead")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            ids = selectors.parse_batch_ids(str(i) for i in options["batch_ids"])
            comparison = selectors.batches_compare(batch_ids=ids)
        except selectors.ComparisonError as exc:
            raise usage_error(str(exc)) from exc
        data = comparison_json(comparison)
        if options["json"]:
            self.stdout.write(json.dumps(data))
            return
        for line in comparison_table(data):
            self.stdout.write(line)
