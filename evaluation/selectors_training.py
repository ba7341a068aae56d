"""Reads for a training job's held-out evaluation: the seeds it plays, its batches and their
scores. Which base-model batch each one compares with is `evaluation.baselines`."""

from __future__ import annotations

from evaluation import selectors
from evaluation.baselines import (
    EvaluationRow,
    batches_covering_seeds,
    fine_tuned_row,
    is_playing,
)
from evaluation.statistics import summarize
from rollouts.game.scoring import score_text
from rollouts.models import Episode
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


def job_seed_pairs(*, job: TrainingJob) -> set[tuple[int, int]]:
    """(batch, seed) of what the job trained on: its dataset version's episodes, or, for a
    GRPO job (no dataset), the episodes its iterations played."""
    if job.dataset_version_id is not None:
        return selectors.dataset_version_seed_pairs(version=job.dataset_version)
    played = Episode.objects.filter(batch__grpo_iteration__job_id=job.id)
    return set(played.values_list("batch_id", "seed").distinct())


def job_held_out_plan(*, job: TrainingJob, count: int) -> selectors.HeldOutPlan:
    """`count` seeds the job never trained on, and its base model's batches on all of them."""
    seeds = selectors.held_out_seeds_for(used=job_seed_pairs(job=job), count=count)
    return selectors.HeldOutPlan(
        seeds=seeds, base_batches=batches_covering_seeds(model=job.model, seeds=seeds)
    )
