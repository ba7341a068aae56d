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

from rollouts.models import REVIEW_PERMISSION
from training import selectors, services
from training.forms import TrainingJobForm
from training.models import TrainingJob

SUBMIT_PERMISSION = "training.submit_job"
# The batch form's permission: Evaluate starts batches, nothing more.
EVALUATE_PERMISSION = REVIEW_PERMISSION
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


def job_detail_context(request: HttpRequest, job: TrainingJob, **extra) -> dict:
    """The job page's context. Its evaluation section comes from the `evaluation` app's
    `{% job_evaluation %}` tag (given `evaluate_form` when a POST to Evaluate failed)."""
    return {
        "job": job,
        "events": selectors.job_events(job=job),
        "chart": selectors.job_loss_chart(job=job),
        "validation": selectors.job_validation_source(job=job),
        "local_run": selectors.job_local_run(job=job),
        "grpo": selectors.job_grpo(job=job),
        "can_submit": request.user.has_perm(SUBMIT_PERMISSION),
        "poll_seconds": POLL_SECONDS,
        "evaluable": job.status == TrainingJob.Status.SUCCEEDED and bool(job.fine_tuned_model),
        "can_evaluate": request.user.has_perm(EVALUATE_PERMISSION),
        **extra,
    }


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
    return render(request, template, job_detail_context(request, job))


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
