"""Reads for a training job's held-out evaluation: its batches, their scores, and the
base-model batch each one can be compared with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.urls import reverse

from evaluation import selectors
from rollouts.evaluation import summarize
from rollouts.models import RolloutBatch
from rollouts.scoring import score_text
from training.models import TrainingJob

MAX_EVALUATIONS_SHOWN = 20
_ACTIVE = (RolloutBatch.Status.PENDING, RolloutBatch.Status.RUNNING)


def _setup(batch: RolloutBatch) -> tuple[Any, ...]:
    """What must match for two batches' scores to measure the same thing, model aside: a
    256-step score is not comparable with a 10,000-step one, nor text-only with images."""
    settings = batch.settings if isinstance(batch.settings, dict) else {}
    return (
        batch.step_limit,
        batch.image_size,
        str(settings.get("observation_mode", "image_text")),
        int(settings.get("history_frames", 0) or 0),
    )


def evaluation_baselines(*, batch: RolloutBatch, base_model: str) -> list[RolloutBatch]:
    """Base-model batches with `batch`'s setup on all of its seeds, the one to compare first.

    Finished batches that played every seed (whichever way they were started), newest
    first; then the job's own base-model batches still playing them.
    """
    wanted = _setup(batch)
    finished = [
        b
        for b in selectors.batches_covering_seeds(model=base_model, seeds=batch.seeds)
        if _setup(b) == wanted and b.id != batch.id
    ]
    playing = [
        b
        for b in RolloutBatch.objects.filter(
            evaluates_id=batch.evaluates_id,
            policy=RolloutBatch.Policy.OPENAI,
            model=base_model,
            seeds=batch.seeds,
            status__in=_ACTIVE,
        ).order_by("-id")
        if _setup(b) == wanted
    ]
    return finished + playing


def compare_url(*, base: RolloutBatch, other: RolloutBatch) -> str:
    """The comparison page, the base model first: differences read as "fine-tuned - base"."""
    return f"{reverse('evaluation:compare')}?batches={base.id},{other.id}"


@dataclass(frozen=True)
class EvaluationRow:
    batch: RolloutBatch
    role: str  # "fine-tuned" or "base"
    score: str  # the Crafter score of its finished episodes, or "—"
    baseline: RolloutBatch | None = None  # fine-tuned rows: the base-model batch to compare
    compare_url: str = ""


def job_evaluations(*, job: TrainingJob) -> list[EvaluationRow]:
    """The job's evaluation batches, newest first, each with its score and, for the
    fine-tuned model's, the base-model batch on the same seeds and the comparison link."""
    batches = list(job.evaluation_batches.order_by("-id")[:MAX_EVALUATIONS_SHOWN])
    outcomes = selectors.outcomes_by_batch(batch_ids=[b.id for b in batches])
    rows = []
    for batch in batches:
        summary = summarize(outcomes.get(batch.id, []))
        score = score_text(summary.crafter_score if summary.finished else None)
        if batch.model == job.fine_tuned_model:
            found = evaluation_baselines(batch=batch, base_model=job.model)
            baseline = found[0] if found else None
            rows.append(
                EvaluationRow(
                    batch=batch,
                    role="fine-tuned",
                    score=score,
                    baseline=baseline,
                    compare_url=compare_url(base=baseline, other=batch) if baseline else "",
                )
            )
        else:
            rows.append(EvaluationRow(batch=batch, role="base", score=score))
    return rows


def batch_evaluation(*, batch: RolloutBatch) -> EvaluationRow | None:
    """What the batch page says of a batch started by a training job's Evaluate."""
    if batch.evaluates_id is None:
        return None
    job = TrainingJob.objects.get(id=batch.evaluates_id)
    if batch.model != job.fine_tuned_model:
        return EvaluationRow(batch=batch, role="base", score="")
    found = evaluation_baselines(batch=batch, base_model=job.model)
    baseline = found[0] if found else None
    return EvaluationRow(
        batch=batch,
        role="fine-tuned",
        score="",
        baseline=baseline,
        compare_url=compare_url(base=baseline, other=batch) if baseline else "",
    )
