"""`python manage.py training_status N`: the job's JSON summary (as `submit_training` ends)."""

from __future__ import annotations

import json
from typing import Any

from studio.commands import StudioCommand, usage_error
from training import selectors
from training.models import TrainingJob


class Command(StudioCommand):
    help = "Print a training job's summary as one JSON line."

    def add_arguments(self, parser) -> None:
        parser.add_argument("job_id", type=int)

    def handle(self, *args: Any, **options: Any) -> None:
        job = TrainingJob.objects.filter(id=options["job_id"]).first()
        if job is None:
            raise usage_error(f"job: no training job {options['job_id']}")
        self.stdout.write(json.dumps(selectors.job_summary(job)))
