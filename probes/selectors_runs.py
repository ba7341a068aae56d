"""Reads of a probe run: what `probes.results` needs of its answers, and `probe_run`'s summary."""

from __future__ import annotations

from typing import Any

from probes.models import ProbeAnswer, ProbeRun
from probes.results import AnswerRecord, run_results
from studio.models import Endpoint
from studio.spend import prices_of, spend, spend_json


def run_answer_records(*, run_id: int) -> list[AnswerRecord]:
    """Every stored answer of the run with what `probes.results` needs of its question."""
    rows = (
        ProbeAnswer.objects.filter(run_id=run_id)
        .order_by("question__index")
        .values_list(
            "question_id",
            "question__kind",
            "question__choices",
            "question__answer",
            "question__subject",
            "choice",
            "error_kind",
        )
    )
    return [
        AnswerRecord(
            question_id=qid,
            kind=kind,
            choices=tuple(choices),
            answer=answer,
            subject=subject,
            choice=choice,
            error_kind=error_kind,
        )
        for qid, kind, choices, answer, subject, choice, error_kind in rows
    ]


def probe_run_summary(*, run: ProbeRun) -> dict[str, Any]:
    """`probe_run`'s last line, plus the run's status and counters.
    `answered` counts the answers naming a choice, what `accuracy` is over (null when there
    is none); `errors` the rest, apart."""
    run.refresh_from_db()
    results = run_results(run_answer_records(run_id=run.id), kinds=run.probe_set.kinds)
    overall = results.overall
    figures = overall.figures_json()
    summary = {
        "run_id": run.id,
        "set_id": run.probe_set_id,
        "model": run.model,
        "observation": run.observation,
        "questions": run.questions_total,
        "answered": overall.answered,
        "errors": overall.errors,
        "accuracy": figures["accuracy"],
        "kinds": results.kinds_json(),
        "status": run.status,
        "endpoint": run.endpoint_name,
        "correct": overall.correct,
        "interval": figures["interval"],
        "chance": figures["chance"],
        "error_share": round(overall.error_share, 4),
        "errors_over_limit": overall.errors_over_limit,
        "model_calls": run.model_calls,
        "model_retries": run.model_retries,
        "prompt_tokens": run.prompt_tokens,
        "completion_tokens": run.completion_tokens,
    }
    # As `rollout`'s summary: what the calls cost, where the endpoint has prices.
    prices = prices_of(Endpoint.objects.filter(name=run.endpoint_name).first())
    if prices is not None:
        summary["spend"] = spend_json(
            spend(
                prompt_tokens=run.prompt_tokens,
                completion_tokens=run.completion_tokens,
                prices=prices,
            )
        )
    return summary
