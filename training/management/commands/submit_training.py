"""`python manage.py submit_training`: a dataset version to a fine-tuning provider, or a
GRPO config (`[training] mode = "grpo"`), which takes no dataset, to the trl provider.

See docs/training.md.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, NoReturn

from django.conf import settings
from django.core.management.base import CommandError

from curation import services as dataset_services
from curation.models import Dataset
from studio.commands import StudioCommand, usage_error
from studio.queue import QUEUE_UNREACHABLE
from training import selectors, services
from training.config import ConfigError, config_load
from training.models import TrainingJob
from training.providers import ProviderError, provider_names
from training.submission import (
    GRPO_NO_DATASET,
    config_text_is_grpo,
    dataset_newest_version,
    submission_build,
)
from training.upload_files import DataRefused


class Command(StudioCommand):
    help = (
        "Validate a training config and a dataset version, upload the version in the "
        "provider's format, create and start the job; a GRPO config ([training] mode = "
        '"grpo", trl provider) takes no dataset: it trains on the episodes it plays. '
        "The last line is a JSON summary. "
        "Exit 2 on bad input (one line per problem); with --wait, 1 unless it succeeded."
    )

    def add_arguments(self, parser) -> None:
        # One of them, unless the config is GRPO's (checked in `handle`, once it is read).
        source = parser.add_mutually_exclusive_group()
        source.add_argument("--dataset-version", type=int, metavar="N")
        source.add_argument(
            "--dataset",
            type=int,
            metavar="N",
            help="its newest finished version (exported now if it has none)",
        )
        parser.add_argument("--validation-version", type=int, metavar="M")
        parser.add_argument("--config", required=True, metavar="FILE.toml")
        parser.add_argument("--provider", choices=provider_names(), default="synth")
        parser.add_argument(
            "--base-url",
            default="",
            help="default: SYNTH_BACKEND_URL (synth) or OPENAI_BASE_URL (openai); the key "
            "comes from SYNTH_API_KEY / OPENAI_API_KEY",
        )
        parser.add_argument("--model", default="", help="overrides [job] model")
        parser.add_argument("--dry-run", action="store_true", help="print the requests only")
        parser.add_argument("--wait", action="store_true", help="follow the job to its end")

    @staticmethod
    def _refuse(lines: list[str]) -> NoReturn:
        raise usage_error("\n".join(lines))

    def handle(self, *args: Any, **options: Any) -> None:
        path = Path(options["config"])
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            self._refuse([f"config: cannot read {str(path)!r} ({exc.__class__.__name__})"])
        version_id = options["dataset_version"]
        given = version_id is not None or options["dataset"] is not None
        if config_text_is_grpo(text):
            if given:
                flag = "--dataset" if options["dataset"] is not None else "--dataset-version"
                self._refuse([f"{flag}: {GRPO_NO_DATASET}; give none"])
        elif not given:
            # A text that is not TOML may have meant GRPO: its own errors first.
            try:
                config_load(text)
            except ConfigError as exc:
                self._refuse(exc.lines())
            self._refuse(["one of the arguments --dataset-version --dataset is required"])
        if options["dataset"] is not None:
            version_id = self._dataset_version(options["dataset"], text)
        try:
            submission = submission_build(
                config_text=text,
                provider=options["provider"],
                version_id=version_id,
                validation_version_id=options["validation_version"],
                base_url=options["base_url"],
                model=options["model"],
            )
        except services.SubmissionError as exc:
            self._refuse(exc.lines)
        if options["dry_run"]:
            try:
                plans = services.training_job_plan(submission=submission, build_files=True)
            except DataRefused as exc:
                self._refuse(exc.lines)
            for plan in plans:
                note = f"  # {plan.note}" if plan.note else ""
                self.stdout.write(f"{plan.method} {plan.url}{note}")
                self.stdout.write(json.dumps(plan.body, indent=2))
            self.stdout.write(
                json.dumps(
                    {
                        "job_id": None,
                        "status": "dry_run",
                        "provider": submission.provider,
                        "remote_job_id": None,
                        "fine_tuned_model": None,
                        "events": 0,
                        "requests": [p.to_json() for p in plans],
                    }
                )
            )
            return
        job = services.training_job_create(submission=submission)
        if selectors.job_unsent(job_id=job.id):
            # Saved, not lost: the periodic requeue sends it once the broker answers again.
            self.stderr.write(f"{QUEUE_UNREACHABLE}; the job will be submitted when it is back")
        if options["wait"]:
            job = self._follow(job)
        self.stdout.write(json.dumps(selectors.job_summary(job)))
        if options["wait"] and job.status != TrainingJob.Status.SUCCEEDED:
            reason = f": {job.error}" if job.error else ""
            raise CommandError(f"training job {job.id} {job.status}{reason}", returncode=1)

    def _dataset_version(self, dataset_id: int, text: str) -> int:
        dataset = Dataset.objects.filter(id=dataset_id).first()
        if dataset is None:
            self._refuse([f"dataset: no dataset {dataset_id}"])
        version = dataset_newest_version(dataset_id)
        if version is not None:
            return version.id
        # Check the config before exporting: a typo must not cost an export.
        try:
            config_load(text)
        except ConfigError as exc:
            self._refuse(exc.lines())
        self.stderr.write(f"Dataset {dataset_id} has no finished version: exporting one")
        version = dataset_services.dataset_version_create(dataset=dataset, enqueue=False)
        outcome = dataset_services.dataset_version_export(version_id=version.id)
        version.refresh_from_db()
        if outcome != "done":
            raise CommandError(f"export failed: {version.error}", returncode=1)
        return version.id

    def _follow(self, job: TrainingJob) -> TrainingJob:
        """Print events as they arrive; ask the provider ourselves (no beat needed)."""
        seen: set[int] = set()
        last_poll = 0.0
        status = ""
        while True:
            job.refresh_from_db()
            if job.status != status:
                status = job.status
                self.stderr.write(f"[job {job.id}] {status}")
            for event in job.events.exclude(id__in=seen).order_by("time", "id"):
                seen.add(event.id)
                # One line an event, so a provider's text cannot pass for a line of ours.
                message = event.message.replace("\n", "\\n")
                self.stderr.write(f"  {event.time:%Y-%m-%d %H:%M:%S} {event.level:7} {message}")
            if job.status in TrainingJob.TERMINAL:
                return job
            interval = settings.STUDIO_TRAINING_POLL_SECONDS
            if job.remote_job_id and job.submitted_at and time.monotonic() - last_poll >= interval:
                last_poll = time.monotonic()
                try:
                    services.training_job_poll(job_id=job.id)
                except ProviderError as exc:
                    self.stderr.write(f"poll: {exc}")
                continue
            time.sleep(min(1.0, interval))
