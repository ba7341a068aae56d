"""Reads for a training job's held-out evaluation: its batches and their scores. Which
base-model batch each one compares with is `evaluation.baselines`."""

from __future__ import annotations

from evaluation import selectors
from evaluation.baselines import EvaluationRow, fine_tuned_row, is_playing
from evaluation.statistics import summarize
from rollouts.game.scoring import score_text
from training.models import TrainingJob

MAX_EVALUATIONS_SHOWN = 20


def job_evaluations(*, job: TrainingJob) -> list[EvaluationRow]:
    """The job's evaluation batches, newest first, each with its score and, for the
    fine-tuned model's, the base-model batch on the same seeds and the comparison link."""
    batches = list(job.evaluation_batches.order_by("-id")[:MAX_EVALUATIONS_SHOWN])
    outcomes = selectors.outcomes_by_batch(batch_ids=[b.id for b in batches])
    rows = []
    for batch in batches:
        summary = summarize(outcomes.get(batch.id, []))
        score = score_text(summary.crafter_score if summary.finished else None)
        if summary.finished and is_playing(batch):
            score += " so far"  # of the episodes ended: not the batch's result yet
        if batch.model == job.fine_tuned_model:
            rows.append(fine_tuned_row(batch=batch, base_model=job.model, score=score))
        else:
            rows.append(EvaluationRow(batch=batch, role="base", score=score))
    return rows
