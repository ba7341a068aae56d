"""Reads for a batch started by a training job's "Evaluate": the base-model batches it can
be compared with, and what the batch page says of it.

They live with the batches they read: the batch page (here) and the evaluation and training
pages (which import this) all ask the same question, and rollouts never imports evaluation.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.urls import reverse

from rollouts.models import Episode, RolloutBatch
from rollouts.policies.kinds import model_policy_names

_ACTIVE = (RolloutBatch.Status.PENDING, RolloutBatch.Status.RUNNING)


def batches_covering_seeds(*, model: str, seeds: Iterable[int]) -> list[RolloutBatch]:
    """Finished batches of `model` (a model-calling policy) that played every one of `seeds`,
    newest first.

    What "the base model was evaluated on those seeds too" means for a comparison link.
    """
    wanted = set(seeds)
    candidates = RolloutBatch.objects.filter(
        policy__in=model_policy_names(), model=model, status=RolloutBatch.Status.FINISHED
    ).order_by("-id")
    played: dict[int, set[int]] = defaultdict(set)
    for batch_id, seed in Episode.objects.filter(
        batch__in=candidates, seed__in=wanted, status=Episode.Status.FINISHED
    ).values_list("batch_id", "seed"):
        played[batch_id].add(seed)
    return [b for b in candidates if wanted and played.get(b.id, set()) >= wanted]


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
        for b in batches_covering_seeds(model=base_model, seeds=batch.seeds)
        if _setup(b) == wanted and b.id != batch.id
    ]
    playing = [
        b
        for b in RolloutBatch.objects.filter(
            evaluates_id=batch.evaluates_id,
            policy__in=model_policy_names(),
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


def is_playing(batch: RolloutBatch) -> bool:
    """Pending or running: its score is that of the episodes ended so far, not a result."""
    return batch.status in _ACTIVE


@dataclass(frozen=True)
class EvaluationRow:
    batch: RolloutBatch
    role: str  # "fine-tuned" or "base"
    score: str  # the Crafter score of its finished episodes, or "—"
    baseline: RolloutBatch | None = None  # fine-tuned rows: the base-model batch to compare
    # Only once the baseline has ended: a comparison with a base batch still playing would
    # show the score of its first episodes as if it were the base model's.
    compare_url: str = ""

    @property
    def waits_for(self) -> RolloutBatch | None:
        """The base batch the comparison waits for, while it plays."""
        return self.baseline if self.baseline and is_playing(self.baseline) else None


def fine_tuned_row(*, batch: RolloutBatch, base_model: str, score: str) -> EvaluationRow:
    """A fine-tuned model's batch with the base-model batch to compare it with, if any; the
    comparison link once that batch has ended."""
    found = evaluation_baselines(batch=batch, base_model=base_model)
    baseline = found[0] if found else None
    ended = baseline is not None and not is_playing(baseline)
    return EvaluationRow(
        batch=batch,
        role="fine-tuned",
        score=score,
        baseline=baseline,
        compare_url=compare_url(base=baseline, other=batch) if ended else "",
    )


def batch_evaluation(*, batch: RolloutBatch) -> EvaluationRow | None:
    """What the batch page says of a batch started by a training job's Evaluate."""
    job = batch.evaluates
    if job is None:
        return None
    if batch.model != job.fine_tuned_model:
        return EvaluationRow(batch=batch, role="base", score="")
    return fine_tuned_row(batch=batch, base_model=job.model, score="")
