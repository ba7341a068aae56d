"""Comparison and leaderboard pages, and Evaluate on a training job's page. Login is enforced
by LoginRequiredMiddleware; Evaluate starts batches, so it needs `rollouts.review_turn`."""

from __future__ import annotations

import json

from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from evaluation import charts, selectors, services
from evaluation.forms import EvaluateForm
from evaluation.reports import comparison_csv, comparison_json
from rollouts.game.crafter_env import ACHIEVEMENTS
from rollouts.models import REVIEW_PERMISSION, RolloutBatch
from training.models import TrainingJob
from training.views import job_detail_context

# Evaluate starts batches, nothing more: the batch form's permission.
EVALUATE_PERMISSION = REVIEW_PERMISSION

SEEDS_SHOWN = 200  # seed links on the page; the downloads hold them all


def _url_pattern(name: str) -> str:
    """A URL with one integer argument as a format string: `/episodes/{}/`."""
    return reverse(name, args=[_SENTINEL]).replace(str(_SENTINEL), "{}", 1)


_SENTINEL = 918273645


def _batch_label(batch) -> str:
    what = batch.model or batch.policy
    return f"#{batch.id} {batch.name or what}"


@require_GET
def compare(request: HttpRequest) -> HttpResponse:
    """`/compare/?batches=3,5,8` (or `batches=3&batches=5` from the batch list's checkboxes)."""
    fmt = request.GET.get("format", "html")
    try:
        ids, comparison = _comparison_asked(request)
    except selectors.ComparisonError as exc:
        if fmt in ("json", "csv"):
            return JsonResponse({"error": str(exc)}, status=400)
        typed = ",".join(request.GET.getlist("batches"))[:200]
        return render(request, "evaluation/compare.html", {"error": str(exc), "query": typed})
    query = ",".join(str(i) for i in ids)
    if fmt in ("json", "csv"):
        return _comparison_download(comparison, fmt=fmt, query=query)
    labels = {c.batch.id: _batch_label(c.batch) for c in comparison.columns}
    context = {
        "comparison": comparison,
        "labels": labels,
        "query": query,
        "rate_rows": _rate_rows(comparison),
        "rates_svg": _rates_svg(comparison, labels),
        "score_svg": _score_svg(comparison, labels),
        "seed_rows": _seed_rows(comparison, query),
        "seeds_hidden": max(0, len(comparison.shared_seeds) - SEEDS_SHOWN),
    }
    return render(request, "evaluation/compare.html", context)


def _comparison_asked(request: HttpRequest) -> tuple[list[int], selectors.BatchComparison]:
    values = request.GET.getlist("batches")
    ids = selectors.parse_batch_ids(values)
    if len(values) > 1:
        # Ticked in the batch list (newest first there): the oldest is the baseline.
        ids.sort()
    return ids, selectors.batches_compare(batch_ids=ids)


def _comparison_download(
    comparison: selectors.BatchComparison, *, fmt: str, query: str
) -> HttpResponse:
    data = comparison_json(comparison)
    if fmt == "json":
        response = HttpResponse(json.dumps(data, indent=1), content_type="application/json")
    else:
        response = HttpResponse(comparison_csv(data), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="compare-{query}.{fmt}"'
    return response


def _rate_rows(comparison: selectors.BatchComparison) -> list[dict]:
    """Per achievement: each batch's success rate and interval, then each paired difference."""
    return [
        {
            "name": name,
            "cells": [
                (c.summary.success_rates[name], c.summary.rate_intervals[name])
                for c in comparison.columns
            ],
            "diffs": [
                (d.paired.success_rates[name], d.paired.rate_intervals[name])
                for d in comparison.differences
            ],
        }
        for name in ACHIEVEMENTS
    ]


def _rates_svg(comparison: selectors.BatchComparison, labels: dict[int, str]) -> str:
    series = [
        charts.Series(
            label=labels[c.batch.id],
            rates=c.summary.success_rates,
            intervals=c.summary.rate_intervals,
        )
        for c in comparison.columns
    ]
    title = "Success rate per achievement on the shared seeds, with 95% intervals"
    return charts.for_every_screen(
        lambda layout: charts.rates_chart(series, title=title, layout=layout)
    )


def _score_svg(comparison: selectors.BatchComparison, labels: dict[int, str]) -> str:
    points = [
        (labels[c.batch.id], c.summary.crafter_score, c.summary.score_interval)
        for c in comparison.columns
    ]
    title = "Crafter score on the shared seeds, with 95% bootstrap intervals"
    return charts.for_every_screen(
        lambda layout: charts.score_chart(points, title=title, layout=layout)
    )


def _seed_rows(comparison: selectors.BatchComparison, query: str) -> list[dict]:
    """The first SEEDS_SHOWN shared seeds: each batch's episode and each paired result."""
    per_seed = {d.batch.id: {r.seed: r for r in d.paired.per_seed} for d in comparison.differences}
    # Hundreds of rows with links: resolve each URL pattern once, not once per link.
    episode_url = _url_pattern("rollouts:episode_detail")
    seed_url = _url_pattern("evaluation:compare_seed")
    seed_rows = []
    for seed in comparison.shared_seeds[:SEEDS_SHOWN]:
        episodes = [
            (comparison.episode_ids.get((c.batch.id, seed)) or [None])[0]
            for c in comparison.columns
        ]
        seed_rows.append(
            {
                "seed": seed,
                "url": f"{seed_url.format(seed)}?batches={query}",
                "episodes": [(e, episode_url.format(e) if e else "") for e in episodes],
                "results": [per_seed[d.batch.id].get(seed) for d in comparison.differences],
            }
        )
    return seed_rows


@require_GET
def compare_seed(request: HttpRequest, seed: int) -> HttpResponse:
    """One seed's episodes of several batches next to each other, one step slider for all."""
    try:
        ids = selectors.parse_batch_ids(request.GET.getlist("batches"))
        columns = selectors.seed_episodes(batch_ids=ids, seed=seed)
    except selectors.ComparisonError as exc:
        return render(request, "evaluation/compare_seed.html", {"error": str(exc), "seed": seed})
    try:
        step = max(0, int(request.GET.get("step", "0")))
    except ValueError:
        step = 0
    longest = max((len(c.frames) for c in columns), default=0)
    config = {
        "step": min(step, max(longest - 1, 0)),
        "frameUrl": reverse("rollouts:frame_image", args=["0" * 64]),
        "viewerUrl": reverse("rollouts:episode_detail", args=[0]),
        "columns": [
            {
                "episode": c.episode.id if c.episode else None,
                "frames": c.frames,
                "turnSteps": c.turn_steps,
                "unlocked": c.episode.achievements if c.episode else {},
            }
            for c in columns
        ],
    }
    return render(
        request,
        "evaluation/compare_seed.html",
        {
            "seed": seed,
            "columns": [(c, _batch_label(c.batch)) for c in columns],
            "config": config,
            "longest": longest,
            "query": ",".join(str(i) for i in ids),
        },
    )


@require_GET
def leaderboard(request: HttpRequest) -> HttpResponse:
    """`/leaderboard/`: policies' own games; `?include=forks` adds forks and people's games."""
    include_forks = request.GET.get("include") == "forks"
    rows = selectors.leaderboard_rows(include_forks=True)
    reference = selectors.reference_scores()
    ranked, rank, studio_rows = [], 0, 0
    for row in rows:
        if not row.is_own_play and not include_forks:
            continue
        # References, forks and people's games sit where their score puts them, but only a
        # policy's own games are ranked.
        ranked_row = not row.is_reference and row.is_own_play
        rank += ranked_row
        studio_rows += not row.is_reference
        ranked.append((rank if ranked_row else None, row))
    return render(
        request,
        "evaluation/leaderboard.html",
        {
            "rows": ranked,
            "source": reference["source"],
            "studio_rows": studio_rows,
            "include_forks": include_forks,
            "other_rows": sum(not row.is_own_play for row in rows),
        },
    )


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
            batch, created = services.evaluation_batch_create(
                job=job,
                endpoint=form.cleaned_data["endpoint"],
                count=form.cleaned_data["count"],
                steps=form.cleaned_data["steps"],
                created_by=request.user,
            )
        except services.EvaluationError as exc:
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
    context = job_detail_context(request, job, evaluate_form=form)
    return render(request, "training/job_detail.html", context, status=400)


@require_POST
@permission_required(EVALUATE_PERMISSION, raise_exception=True)
def job_evaluate_base(request: HttpRequest, job_id: int, batch_id: int) -> HttpResponse:
    """Play the base model on the seeds of one of the job's evaluation batches."""
    batch = get_object_or_404(RolloutBatch, id=batch_id, evaluates_id=job_id)
    try:
        base, created = services.baseline_batch_create(batch=batch, created_by=request.user)
    except services.EvaluationError as exc:
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
