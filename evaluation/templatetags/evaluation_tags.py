"""Number formats of the evaluation pages, and what other apps' pages show of evaluation
(rollouts and training link to it from their templates; their code never imports it)."""

from __future__ import annotations

from django import template

from evaluation.baselines import EvaluationRow, batch_evaluation, is_playing
from evaluation.forms import EvaluateForm
from evaluation.selectors_training import job_evaluations, job_held_out_plan
from rollouts.rollout_settings import seeds_spec

register = template.Library()


@register.filter
def signed(value: float, digits: int = 2) -> str:
    """+1.25 / -0.50 / 0.00: a difference always shows its direction."""
    number = float(value)
    text = f"{number:+.{int(digits)}f}"
    return (
        text.lstrip("+") if float(text) == 0 else text.replace("-", "\u2212")
    )  # a true minus sign


@register.filter
def seeds_text(seeds: list[int], limit: int = 30) -> str:
    """Seeds as a short list: `1, 2, 7 … and 40 more`."""
    shown = ", ".join(str(s) for s in seeds[: int(limit)])
    more = len(seeds) - int(limit)
    return f"{shown} … and {more} more" if more > 0 else shown


@register.filter
def get_item(mapping: dict, key: object) -> object:
    return mapping.get(key, "")


@register.simple_tag
def evaluation_of(batch) -> EvaluationRow | None:
    """`{% evaluation_of batch as evaluation %}`: what the batch page says of a batch started
    by a training job's Evaluate (the job, and the comparison with its base batch)."""
    return batch_evaluation(batch=batch)


@register.inclusion_tag("training/partials/job_evaluation.html", takes_context=True)
def job_evaluation(context, job) -> dict:
    """A training job page's evaluation section: the Evaluate form with the held-out seeds it
    would play, and the batches it started (`evaluate_form`: a POST's, with its errors)."""
    form = context.get("evaluate_form")
    evaluations = job_evaluations(job=job)
    section = {
        "job": job,
        "evaluable": context.get("evaluable"),
        "can_evaluate": context.get("can_evaluate"),
        "evaluations": evaluations,
        # A batch still playing: the table refreshes itself until every one has ended.
        "evaluations_playing": any(is_playing(row.batch) for row in evaluations),
        "poll_seconds": context.get("poll_seconds") or 2,
        "evaluate_form": form,
        "csrf_token": context.get("csrf_token"),
    }
    if section["evaluable"] and section["can_evaluate"]:
        form = form or EvaluateForm()
        count = form.cleaned_data["count"] if form.is_bound and form.is_valid() else None
        plan = job_held_out_plan(job=job, count=count or form.fields["count"].initial)
        section.update(
            evaluate_form=form,
            held_out_seeds=seeds_spec(plan.seeds),
            held_out_count=len(plan.seeds),
        )
    return section
