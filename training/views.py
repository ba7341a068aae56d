"""Training pages. Login is enforced by LoginRequiredMiddleware; submitting and cancelling
need `training.submit_job` (superusers have it); everyone logged in can look.

Evaluating a succeeded job starts rollout batches, so it needs what starting a batch needs
(`rollouts.review_turn`), not the training permission: evaluating trains nothing."""

from __future__ import annotations

import json

from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from evaluation import selectors_training as evaluation_selectors
from evaluation import services as evaluation_services
from evaluation.forms import EvaluateForm
from evaluation.selectors import held_out_plan
from rollouts.models import RolloutBatch
from rollouts.rollout_settings import seeds_spec
from training import selectors, services
from training.forms import TrainingJobForm
from training.models import TrainingJob

SUBMIT_PERMISSION = "training.submit_job"
# The batch form's permission: Evaluate starts batches, nothing more.
EVALUATE_PERMISSION = "rollouts.review_turn"
POLL_SECONDS = 2


@require_GET
def job_list(request: HttpRequest) -> HttpResponse:
    jobs = list(selectors.jobs_recent()[:200])
    return render(
        request,
        "training/job_list.html",
        {
            "jobs": jobs,
            "can_submit": request.user.has_perm(SUBMIT_PERMISSION),
            "poll": any(job.is_active for job in jobs),
            "poll_seconds": POLL_SECONDS,
        },
    )


@require_http_methods(["GET", "POST"])
@permission_required(SUBMIT_PERMISSION, raise_exception=True)
def job_new(request: HttpRequest) -> HttpResponse:
    form = TrainingJobForm(request.POST or None)
    preview = None
    if request.method == "POST" and form.is_valid():
        assert form.submission is not None
        if request.POST.get("action") == "submit":
            job = services.training_job_create(submission=form.submission, created_by=request.user)
            messages.success(request, f"Training job {job.id} submitted.")
            return redirect("training:job_detail", job_id=job.id)
        plans = services.training_job_plan(submission=form.submission, build_files=False)
        preview = [
            {**plan.to_json(), "body_json": json.dumps(plan.body, indent=2)} for plan in plans
        ]
    template = "training/job_new.html"
    if request.htmx and request.method == "POST":
        template = "training/partials/config_check.html"
    checked = request.method == "POST"
    return render(request, template, {"form": form, "preview": preview, "checked": checked})


def _detail_context(
    request: HttpRequest, job: TrainingJob, *, evaluate_form: EvaluateForm | None = None
) -> dict:
    can_evaluate = request.user.has_perm(EVALUATE_PERMISSION)
    evaluable = job.status == TrainingJob.Status.SUCCEEDED and bool(job.fine_tuned_model)
    context = {
        "job": job,
        "events": selectors.job_events(job=job),
        "chart": selectors.job_loss_chart(job=job),
        "validation": selectors.job_validation_source(job=job),
        "can_submit": request.user.has_perm(SUBMIT_PERMISSION),
        "poll_seconds": POLL_SECONDS,
        "evaluable": evaluable,
        "can_evaluate": can_evaluate,
        "evaluations": evaluation_selectors.job_evaluations(job=job),
        "evaluate_form": evaluate_form,
    }
    if evaluable and can_evaluate:
        form = evaluate_form or EvaluateForm()
        count = form.cleaned_data["count"] if form.is_bound and form.is_valid() else None
        plan = held_out_plan(
            version=job.dataset_version,
            count=count or form.fields["count"].initial,
            base_model=job.model,
        )
        context.update(
            evaluate_form=form,
            held_out_seeds=seeds_spec(plan.seeds),
            held_out_count=len(plan.seeds),
        )
    return context


@require_GET
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_object_or_404(
        TrainingJob.objects.select_related(
            "dataset_version__dataset", "validation_version__dataset", "created_by"
        ),
        id=job_id,
    )
    template = "training/job_detail.html"
    if request.htmx:
        template = "training/partials/job_body.html"
    return render(request, template, _detail_context(request, job))


@require_POST
@permission_required(SUBMIT_PERMISSION, raise_exception=True)
def job_cancel(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_object_or_404(TrainingJob, id=job_id)
    if job.is_active:
        services.training_job_cancel(job=job)
        messages.success(request, f"Cancel requested for job {job.id}.")
    return redirect("training:job_detail", job_id=job.id)


@require_POST
@permission_required(SUBMIT_PERMISSION, raise_exception=True)
def job_refresh(request: HttpRequest, job_id: int) -> HttpResponse:
    """Ask again for the model of a job the provider called succeeded without naming it."""
    job = get_object_or_404(TrainingJob, id=job_id)
    outcome = services.training_job_refresh(job_id=job.id)
    if outcome == "succeeded":
        messages.success(request, f"Job {job.id} succeeded: the provider names its model now.")
    elif outcome != "skipped":
        messages.error(request, f"Job {job.id}: still no model id; see its events.")
    return redirect("training:job_detail", job_id=job.id)


@require_POST
@permission_required(EVALUATE_PERMISSION, raise_exception=True)
def job_evaluate(request: HttpRequest, job_id: int) -> HttpResponse:
    """Play the fine-tuned model on held-out seeds (the form: how many, which endpoint)."""
    job = get_object_or_404(
        TrainingJob.objects.select_related("dataset_version__dataset"), id=job_id
    )
    form = EvaluateForm(request.POST)
    if form.is_valid():
        try:
            batch, created = evaluation_services.evaluation_batch_create(
                job=job,
                endpoint=form.cleaned_data["endpoint"],
                count=form.cleaned_data["count"],
                steps=form.cleaned_data["steps"],
                created_by=request.user,
            )
        except evaluation_services.EvaluationError as exc:
            form.add_error(None, str(exc))
        else:
            if created:
                messages.success(
                    request,
                    f"Batch {batch.id} started: the fine-tuned model on "
                    f"{batch.episodes_total} held-out seeds.",
                )
            else:
                messages.info(request, f"Batch {batch.id} already plays these seeds.")
            return redirect("training:job_detail", job_id=job.id)
    context = _detail_context(request, job, evaluate_form=form)
    return render(request, "training/job_detail.html", context, status=400)


@require_POST
@permission_required(EVALUATE_PERMISSION, raise_exception=True)
def job_evaluate_base(request: HttpRequest, job_id: int, batch_id: int) -> HttpResponse:
    """Play the base model on the seeds of one of the job's evaluation batches."""
    batch = get_object_or_404(RolloutBatch, id=batch_id, evaluates_id=job_id)
    try:
        base, created = evaluation_services.baseline_batch_create(
            batch=batch, created_by=request.user
        )
    except evaluation_services.EvaluationError as exc:
        messages.error(request, str(exc))
    else:
        if created:
            messages.success(
                request,
                f"Batch {base.id} started: the base model on the same {base.episodes_total} seeds.",
            )
        else:
            messages.info(request, f"Batch {base.id} of the base model already covers these seeds.")
    return redirect("training:job_detail", job_id=job_id)
