"""A train worker's part of a `trl` job: claim its run, fetch the dataset and the latest
checkpoint, train (`training.open_models.runner`), store the model, end the run.

The run's claim is renewed by the process's keeper however long a step takes; a worker that
dies leaves it to go stale, and the next one resumes from the checkpoint in storage. What the
trainer reports goes through `RunSink` into bounded, cleaned `LocalRunEvent` rows, a metric
point once per step, which the provider's poll reads (`training.local_runs`).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from django.db.models import F
from django.utils import timezone

from studio.claim_keeper import worker_name
from studio.claims import Claim
from studio.jobs import ClaimLost, JobOutcome
from training import model_store
from training.jobs import LOCAL_RUN
from training.local_runs import trained_model_name
from training.models import LocalRun, LocalRunEvent
from training.providers.base import clean_data, clean_number, clean_step, clean_text

logger = logging.getLogger(__name__)

# The events one run keeps at most (metric points are one per step and name); past it only
# errors are kept, so a trainer that logs without end cannot fill the table.
MAX_RUN_EVENTS = 2000
_LEVELS = ("info", "warning", "error")


def local_run_work(*, run_id: int) -> JobOutcome:
    """Train the run on this worker, from its last checkpoint; safe to deliver twice."""
    token = LOCAL_RUN.claim(run_id, attempts=F("attempts") + 1)
    if token is None:
        return LOCAL_RUN.unclaimed(run_id)
    claim = LOCAL_RUN.held(run_id, token)
    run = LocalRun.objects.select_related(
        "job", "job__dataset_version", "job__validation_version"
    ).get(pk=run_id)
    sink = RunSink(run, claim)
    with LOCAL_RUN.kept(run_id, token):
        try:
            return _train(run, claim, sink)
        except ClaimLost:
            return "claim_lost"
        except Exception as exc:
            # A poison run is set aside with its error, never crash-looped.
            logger.exception("local run %s failed", run_id)
            error = f"{type(exc).__name__}: {clean_text(exc, limit=2000)}"
            sink.event("failed", error, level="error")
            claim.fail(error)
            return "failed"


def _train(run: LocalRun, claim: Claim, sink: RunSink) -> JobOutcome:
    from training.open_models.extra import extra_missing

    missing = extra_missing()
    if missing:
        # One line, the job's error on its page: this worker cannot train at all.
        sink.event("failed", missing, level="error")
        claim.fail(missing)
        return "failed"
    from training.open_models.runner import TrainingRefused, run_training

    job = run.job
    work_dir = Path(tempfile.mkdtemp(prefix=f"studio-trl-run-{run.id}-"))
    try:
        spec = _spec(run, work_dir)
        resume = model_store.checkpoint_fetch(job.id, into=work_dir / "resume")
        sink.event("claimed", f"Train worker {worker_name()} took the run")
        if resume is not None:
            step = resume[0]
            sink.event("resumed", f"resumed from step {step}", data={"step": step})
        try:
            result = run_training(spec, sink, resume_from=resume[1] if resume else None)
        except TrainingRefused as exc:
            error = "\n".join(exc.lines)
            sink.event("refused", error, level="error")
            claim.fail(error)
            return "failed"
        if sink.lost:
            raise ClaimLost(f"local run {run.id} was claimed by another worker")
        if result.status == "canceled":
            claim.finish(status=LocalRun.Status.CANCELED, step=result.steps)
            return "canceled"
        return _store_model(run, claim, sink, result)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


def _spec(run: LocalRun, work_dir: Path) -> Any:
    from training.open_models.runner import TrainSpec

    job = run.job
    version = job.dataset_version
    validation = job.validation_version
    return TrainSpec(
        base_model=job.model,
        sections={name: dict(values) for name, values in (job.effective_config or {}).items()},
        dataset_dir=model_store.dataset_fetch(version),
        dataset_sha256=version.hf_sha256,
        dataset_label=f"{version.dataset.name} v{version.number}",
        work_dir=work_dir / "train",
        validation_dir=model_store.dataset_fetch(validation) if validation else None,
    )


def _store_model(run: LocalRun, claim: Claim, sink: RunSink, result: Any) -> JobOutcome:
    sha256 = model_store.model_upload(run.job_id, Path(result.model_dir))
    name = trained_model_name(run.job_id)
    place = f"{model_store.job_prefix(run.job_id)}/model"
    sink.event(
        "model_stored",
        f"Model {name} stored at {place} (manifest sha256 {sha256})",
        data={"fine_tuned_model": name, "storage": place, "sha256": sha256},
    )
    loss = clean_number(result.train_loss)
    if not claim.finish(
        fine_tuned_model=name, model_sha256=sha256, step=result.steps, train_loss=loss
    ):
        return "claim_lost"
    return "done"


class RunSink:
    """What the trainer reports, written as the run's rows (`training.open_models.runner
    .RunSink`): cleaned, bounded, through the run's claim."""

    def __init__(self, run: LocalRun, claim: Claim) -> None:
        self.run_id = run.id
        self.job_id = run.job_id
        self.claim = claim
        self.lost = False
        self._events = LocalRunEvent.objects.filter(
            run_id=run.id, kind=LocalRunEvent.Kind.EVENT
        ).count()

    def event(
        self, type: str, message: str, *, level: str = "info", data: dict | None = None
    ) -> None:
        level = level if level in _LEVELS else "info"
        if self._events >= MAX_RUN_EVENTS and level != "error":
            return
        data = clean_data(data) if isinstance(data, dict) else {}
        LocalRunEvent.objects.create(
            run_id=self.run_id,
            kind=LocalRunEvent.Kind.EVENT,
            time=timezone.now(),
            level=level,
            type=clean_text(type, limit=100),
            message=clean_text(message),
            data=data if isinstance(data, dict) else {},
        )
        self._events += 1
        total = clean_step(data.get("steps")) if type == "started" else None
        if total:
            self._renew(total_steps=total)

    def metrics(
        self, step: int, *, train_loss: float | None = None, validation_loss: float | None = None
    ) -> None:
        step = clean_step(step)
        if step is None:
            return
        now = timezone.now()
        points = [
            LocalRunEvent(
                run_id=self.run_id,
                kind=LocalRunEvent.Kind.METRIC,
                time=now,
                name=name,
                step=step,
                value=value,
            )
            for name, value in (
                ("train", clean_number(train_loss)),
                ("validation", clean_number(validation_loss)),
            )
            if value is not None
        ]
        # A step logged again after a resume keeps its first point: the curve is not doubled.
        LocalRunEvent.objects.bulk_create(points, ignore_conflicts=True)
        self._renew(step=step)

    def should_stop(self) -> bool:
        """Asked after every step: one read by primary key, never throttled."""
        row = (
            LocalRun.objects.filter(pk=self.run_id)
            .values_list("cancel_requested", "claim_token")
            .first()
        )
        if row is None or row[1] != self.claim.token:
            self.lost = True
            return True
        return bool(row[0])

    def checkpoint_saved(self, step: int, directory: Path) -> None:
        model_store.checkpoint_upload(self.job_id, step, Path(directory))
        self._renew(checkpoint_step=step)
        self.event("checkpoint", f"Checkpoint of step {step} stored", data={"step": step})

    def _renew(self, **fields: Any) -> None:
        if not self.claim.renew(**fields):
            self.lost = True
