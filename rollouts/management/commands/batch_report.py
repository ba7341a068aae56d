"""`python manage.py batch_report BATCH_ID [--json]`: success rates and the Crafter score."""

from __future__ import annotations

import json
from typing import Any

from rollouts import selectors
from rollouts.game.scoring import SCORE_UNIT, score_text
from rollouts.models import RolloutBatch
from studio.commands import StudioCommand, usage_error


class Command(StudioCommand):
    help = (
        "Per-achievement success rates (percent of finished episodes) and the Crafter score "
        f"of a batch. The score is in {SCORE_UNIT}; --json gives the same number."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("batch_id", type=int)
        parser.add_argument("--json", action="store_true", help="one JSON object instead")

    def handle(self, *args: Any, **options: Any) -> None:
        batch = RolloutBatch.objects.filter(id=options["batch_id"]).first()
        if batch is None:
            raise usage_error(f"there is no batch {options['batch_id']}")
        rates = selectors.batch_success_rates(batch_id=batch.id)
        summary = selectors.batch_summary(batch=batch)
        # `rollout`'s summary line, every counter and the spend as it has them, plus the rates.
        report = {
            **summary,
            "policy": batch.policy,
            "model": batch.model,
            "success_rates": {k: round(v, 2) for k, v in rates.items()},
        }
        if options["json"]:
            self.stdout.write(json.dumps(report))
            return
        self.stdout.write(
            f"Batch {batch.id} ({batch.policy}{' ' + batch.model if batch.model else ''}): "
            f"{summary['finished']} finished, {summary['failed']} failed"
            + (f", {summary['canceled']} canceled" if summary["canceled"] else "")
            + f" of {summary['episodes']}"
        )
        width = max(len(name) for name in rates)
        self.stdout.write(f"{'achievement'.ljust(width)}  success %")
        for name, rate in rates.items():
            self.stdout.write(f"{name.ljust(width)}  {rate:9.1f}")
        score = score_text(report["crafter_score"] if summary["finished"] else None)
        self.stdout.write(f"{'Crafter score'.ljust(width)}  {score:>9}")
