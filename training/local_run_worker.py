"""A train worker's part of a `trl` job: claim its run, fetch the dataset and the latest
checkpoint, train (`training.open_models.runner`), store the model, end the run. A GRPO job
(`[training] mode = "grpo"`) has no dataset: it plays its own episodes here
(`training.open_models.grpo` with `training.grpo_runs`' player and sink).

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

from studio.claim_keeper import worker_name
from studio.claims import Claim
from studio.jobs import ClaimLost, JobOutcome
from training import model_store
from training.config import config_is_grpo
from training.grpo_runs import GrpoRunSink, StudioPlayer
from training.jobs import LOCAL_RUN
from training.local_runs import trained_model_name
from training.models import LocalRun, TrainingJob
from training.providers.base import clean_number, clean_text
from training.run_sink import MAX_RUN_EVENTS, RunSink

logger = logging.getLogger(__name__)

__all__ = ["MAX_RUN_EVENTS", "RunSink", "local_run_work"]


def local_run_work(*, run_id: int) -> JobOutcome:
    """Train the run on this worker, from its last checkpoint; safe to deliver twice."""
    token = LOCAL_RUN.claim(run_id, attempts=F("attempts") + 1)
    if token is None:
        return LOCAL_RUN.unclaimed(run_id)
    claim = LOCAL_RUN.held(run_id, token)
    run = LocalRun.objects.select_related(
        "job", "job__dataset_version", "job__validation_version"
    ).get(pk=run_id)
    grpo = config_is_grpo(run.job.effective_config or {})
    sink = GrpoRunSink(run, claim) if grpo else RunSink(run, claim)
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


def _sections(job: TrainingJob) -> dict[str, dict]:
    return {name: dict(values) for name, values in (job.effective_config or {}).items()}


def _train(run: LocalRun, claim: Claim, sink: RunSink) -> JobOutcome:
    from training.open_models.extra import extra_missing

    missing = extra_missing()
    if missing:
        # One line, the job's error on its page: this worker cannot train at all.
        sink.event("failed", missing, level="error")
        claim.fail(missing)
        return "failed"
    from training.open_models.grpo_play import IterationCanceled
    from training.open_models.runner import TrainingRefused

    job = run.job
    work_dir = Path(tempfile.mkdtemp(prefix=f"studio-trl-run-{run.id}-"))
    try:
        # A GRPO job has no dataset to fetch; an SFT job's is fetched before anything else.
        spec = None if isinstance(sink, GrpoRunSink) else _spec(run, work_dir)
        resume = model_store.checkpoint_fetch(job.id, into=work_dir / "resume")
        sink.event("claimed", f"Train worker {worker_name()} took the run")
        if resume is not None:
            step = resume[0]
            sink.event("resumed", f"resumed from step {step}", data={"step": step})
        resume_from = resume[1] if resume else None
        try:
            result = _run(run, sink, spec, work_dir, resume_from)
        except TrainingRefused as exc:
            error = "\n".join(exc.lines)
            sink.event("refused", error, level="error")
            claim.fail(error)
            return "failed"
        except IterationCanceled:
            result = None
        if sink.lost:
            raise ClaimLost(f"local run {run.id} was claimed by another worker")
        if result is None or result.status == "canceled":
            steps = result.steps if result is not None else _step_of(run)
            claim.finish(status=LocalRun.Status.CANCELED, step=steps)
            return "canceled"
        return _store_model(run, claim, sink, result)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


def _run(run: LocalRun, sink: RunSink, spec: Any, work_dir: Path, resume_from: Any) -> Any:
    """The trainer: SFT on the fetched dataset, or GRPO on the episodes it plays here."""
    if spec is not None:
        from training.open_models.runner import run_training

        return run_training(spec, sink, resume_from=resume_from)
    from training.open_models.grpo import GrpoSpec, run_grpo
    from training.open_models.grpo_arguments import grpo_settings

    job = run.job
    sections = _sections(job)
    settings = grpo_settings(sections)
    sink.claim.renew(total_steps=settings.iterations)
    player = StudioPlayer(
        run=run, sink=sink, steps=settings.steps_per_episode, reward=settings.reward
    )
    grpo_spec = GrpoSpec(base_model=job.model, sections=sections, work_dir=work_dir / "train")
    return run_grpo(grpo_spec, sink, player, resume_from=resume_from)


def _step_of(run: LocalRun) -> int:
    return LocalRun.objects.filter(id=run.id).values_list("step", flat=True).first() or 0


def _spec(run: LocalRun, work_dir: Path) -> Any:
    from training.open_models.runner import TrainSpec

    job = run.job
    version = job.dataset_version
    validation = job.validation_version
    return TrainSpec(
        base_model=job.model,
        sections=_sections(job),
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
