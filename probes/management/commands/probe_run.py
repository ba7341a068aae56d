"""`python manage.py probe_run`: ask a model every question of a probe set (`docs/probes.md`)."""

from __future__ import annotations

import json
import time
from typing import Any

from django.core.management.base import CommandError

from probes import runs, selectors_runs
from probes.jobs import PROBE_CHUNK
from probes.models import ProbeRun, ProbeSet
from probes.prompting import OBSERVATIONS
from studio.commands import StudioCommand, progress_bar, usage_error
from studio.queue import QUEUE_UNREACHABLE

ENDED = (ProbeRun.Status.DONE, ProbeRun.Status.FAILED, ProbeRun.Status.CANCELED)


class Command(StudioCommand):
    help = (
        "Ask a model on an admin-named endpoint every question of a probe set; the last line "
        "is a JSON summary with the accuracy per kind (95% interval and chance)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "set_id", type=int, nargs="?", metavar="SET_ID", help="the probe set to ask"
        )
        parser.add_argument("--endpoint", metavar="NAME", help="a chat endpoint an admin named")
        parser.add_argument("--model", metavar="M", help="the model to ask")
        parser.add_argument(
            "--observation",
            choices=OBSERVATIONS,
            default="image",
            help="what the model is shown with each question: the frame (default), the "
            "turn's text observation, or nothing (the controls)",
        )
        parser.add_argument(
            "--concurrency",
            type=int,
            metavar="C",
            help="most requests in flight to the endpoint, across all workers "
            "(default: the endpoint's)",
        )
        parser.add_argument(
            "--resume",
            type=int,
            metavar="RUN_ID",
            help="ask what a failed or interrupted run left unanswered",
        )
        parser.add_argument(
            "--cancel",
            type=int,
            metavar="RUN_ID",
            help="stop a pending or running run: it asks nothing more after a second "
            "(--resume asks the rest)",
        )
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument("--wait", action="store_true", help="follow the run to its end")
        mode.add_argument("--inline", action="store_true", help="ask here, no broker needed")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["cancel"] is not None:
            self._cancel(options["cancel"])
            return
        if options["resume"] is not None:
            run = ProbeRun.objects.filter(id=options["resume"]).first()
            if run is None:
                raise usage_error(f"resume: there is no probe run {options['resume']}")
            runs.probe_run_resume(run=run, enqueue=not options["inline"])
        else:
            run = self._create(options)
        if options["inline"]:
            with progress_bar(
                total=run.questions_total, desc=f"probe run {run.id}", unit="question"
            ) as bar:
                runs.probe_run_inline(run=run, progress=lambda n: bar.update(n - bar.n))
        elif PROBE_CHUNK.unsent(run=run):
            # Saved, not lost: the periodic requeue sends it once the broker answers again.
            self.stderr.write(f"{QUEUE_UNREACHABLE}; the run will start when it is back")
        if options["wait"]:
            self._wait(run)
        summary = selectors_runs.probe_run_summary(run=run)
        self.stdout.write(json.dumps(summary))
        stopped = (ProbeRun.Status.FAILED, ProbeRun.Status.CANCELED)
        if (options["inline"] or options["wait"]) and run.status in stopped:
            # Scripts that wait must be able to tell a run that failed (or was canceled while
            # they waited) from one that did not.
            reason = run.error.splitlines()[0] if run.error else "see the run's page"
            raise CommandError(
                f"probe run {run.id} {run.status} after {run.answered} of "
                f"{run.questions_total} questions: {reason}",
                returncode=1,
            )

    def _cancel(self, run_id: int) -> None:
        run = ProbeRun.objects.filter(id=run_id).first()
        if run is None:
            raise usage_error(f"cancel: there is no probe run {run_id}")
        if run.status in ENDED:
            self.stderr.write(f"Probe run {run.id} had already ended ({run.status}).")
        else:
            stopped = runs.probe_run_cancel(run=run)
            self.stderr.write(f"Probe run {run.id} canceled: {stopped} chunk(s) stopped.")
        self.stdout.write(json.dumps(selectors_runs.probe_run_summary(run=run)))

    def _create(self, options: dict[str, Any]) -> ProbeRun:
        if options["set_id"] is None:
            raise usage_error("SET_ID is required (or --resume RUN_ID)")
        for flag in ("endpoint", "model"):
            if not options[flag]:
                raise usage_error(f"--{flag} is required")
        probe_set = ProbeSet.objects.filter(id=options["set_id"]).first()
        if probe_set is None:
            raise usage_error(f"there is no probe set {options['set_id']}")
        try:
            return runs.probe_run_create(
                probe_set=probe_set,
                endpoint_name=options["endpoint"],
                model=options["model"],
                observation=options["observation"],
                concurrency=options["concurrency"],
                enqueue=not options["inline"],
            )
        except runs.RunError as exc:
            raise usage_error(str(exc)) from exc

    def _wait(self, run: ProbeRun) -> None:
        with progress_bar(
            total=run.questions_total, desc=f"probe run {run.id}", unit="question"
        ) as bar:
            while True:
                status, answered = ProbeRun.objects.values_list("status", "answered").get(id=run.id)
                bar.update(answered - bar.n)
                if status in ENDED:
                    return
                time.sleep(0.5)
