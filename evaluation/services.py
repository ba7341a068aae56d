"""Writes for evaluation: the batches a training job's "Evaluate" starts.

A fine-tuned model is played on seeds no episode of its training data played (held out,
chosen by `selectors_training.job_held_out_plan`, the same ones every time), and its base
model on the same seeds with the same settings, so the two can be compared seed by seed on
/compare/. Both batches record the job (`RolloutBatch.evaluates`); their `model` says which
is which.
"""

from __future__ import annotations

from dataclasses import replace

from django.db import transaction

from evaluation.baselines import evaluation_baselines
from evaluation.selectors_training import job_held_out_plan
from rollouts.models import RolloutBatch
from rollouts.policies.endpoints import endpoint_settings
from rollouts.recording import services as rollout_services
from rollouts.rollout_settings import RolloutSettings
from studio.endpoints import EndpointError, endpoint_check_model, endpoint_get
from studio.models import Endpoint
from training.models import TrainingJob

MAX_HELD_OUT_SEEDS = 1000
# A batch of these still stands for its seeds; a failed or canceled one does not, so
# pressing the button again after a failure starts afresh.
_LIVE = (RolloutBatch.Status.PENDING, RolloutBatch.Status.RUNNING, RolloutBatch.Status.FINISHED)


class EvaluationError(ValueError):
    """The job cannot be evaluated as asked; the message says why, in one line."""


def _locked_job(job_id: int) -> TrainingJob:
    # One press at a time per job: two quick clicks must not start two identical batches.
    # Only the job row is locked: a GRPO job has no dataset version to join (an outer join).
    return (
        TrainingJob.objects.select_for_update(of=("self",))
        .select_related("dataset_version")
        .get(id=job_id)
    )


def evaluation_batch_create(
    *,
    job: TrainingJob,
    endpoint: Endpoint,
    count: int,
    steps: int = 256,
    created_by=None,
    enqueue: bool = True,
) -> tuple[RolloutBatch, bool]:
    """Play the job's fine-tuned model on `count` held-out seeds; (batch, created).

    The same job, endpoint and count give the same seeds, so pressing again while the
    batch is live returns that batch instead of playing the same worlds twice.
    """
    if not 1 <= count <= MAX_HELD_OUT_SEEDS:
        raise EvaluationError(f"seeds: {count} is not between 1 and {MAX_HELD_OUT_SEEDS}")
    with transaction.atomic():
        job = _locked_job(job.id)
        if job.status != TrainingJob.Status.SUCCEEDED or not job.fine_tuned_model:
            raise EvaluationError(
                f"training job {job.id} has no fine-tuned model to evaluate ({job.status})"
            )
        try:
            endpoint_check_model(endpoint=endpoint, model=job.fine_tuned_model)
        except EndpointError as exc:
            raise EvaluationError(str(exc)) from exc
        plan = job_held_out_plan(job=job, count=count)
        existing = (
            RolloutBatch.objects.filter(
                evaluates=job,
                model=job.fine_tuned_model,
                endpoint_name=endpoint.name,
                seeds=plan.seeds,
                step_limit=steps,
                status__in=_LIVE,
            )
            .order_by("-id")
            .first()
        )
        if existing is not None:
            return existing, False
        settings = RolloutSettings(
            policy="openai",
            model=job.fine_tuned_model,
            seeds=tuple(plan.seeds),
            steps=steps,
            name=f"Evaluate training job {job.id} (fine-tuned, {len(plan.seeds)} held-out seeds)",
            **endpoint_settings(endpoint),
        )
        batch = rollout_services.batch_create(
            settings=settings, created_by=created_by, enqueue=enqueue
        )
        RolloutBatch.objects.filter(id=batch.id).update(evaluates=job)
        batch.evaluates = job
    return batch, True


def baseline_batch_create(
    *, batch: RolloutBatch, created_by=None, enqueue: bool = True
) -> tuple[RolloutBatch, bool]:
    """Play the job's base model on an evaluation batch's seeds, with its settings and on
    its endpoint; (batch, created). A base-model batch that already covers them is returned
    instead of playing them again."""
    if batch.evaluates_id is None:
        raise EvaluationError(f"batch {batch.id} does not evaluate a training job")
    with transaction.atomic():
        job = _locked_job(batch.evaluates_id)
        if batch.model != job.fine_tuned_model:
            raise EvaluationError(f"batch {batch.id} is not the fine-tuned model's evaluation")
        covering = evaluation_baselines(batch=batch, base_model=job.model)
        if covering:
            return covering[0], False
        source = rollout_services.batch_settings(batch)
        try:
            endpoint = endpoint_get(name=source.endpoint, kind=Endpoint.Kind.CHAT)
            endpoint_check_model(endpoint=endpoint, model=job.model)
        except EndpointError as exc:
            raise EvaluationError(str(exc)) from exc
        settings = replace(
            source,
            model=job.model,
            name=f"Evaluate training job {job.id} (base model, {len(source.seeds)} held-out seeds)",
            # The endpoint as it is now: its URL is what the worker checks the batch against.
            **endpoint_settings(endpoint),
        )
        created = rollout_services.batch_create(
            settings=settings, created_by=created_by, enqueue=enqueue
        )
        RolloutBatch.objects.filter(id=created.id).update(evaluates=job)
        created.evaluates = job
    return created, True
