"""Pages of the vision checkpoints (`/probes/`): sets and runs, a set's balance, a run's
results and its answers to review, two runs compared, the perception leaderboard.

Login is enforced by LoginRequiredMiddleware; building a set, starting a run, flagging and
noting an answer need `rollouts.review_turn`, as batches and turns do. Every text a model
wrote is shown escaped (templates autoescape; the charts escape theirs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.core.paginator import Page, Paginator
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.template.defaultfilters import pluralize
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from probes import results, selectors, services_review
from probes.charts import KindRow, RunSeries, accuracy_svg
from probes.forms import FlagForm, NoteForm, ProbeRunForm, ProbeSetForm
from probes.models import ProbeAnswer, ProbeRun, ProbeSet
from probes.runs import (
    RunError,
    probe_run_cancel,
    probe_run_create,
    probe_run_resume,
)
from probes.selectors_runs import run_answer_records
from probes.services import ProbeSetError, probe_set_create
from rollouts.models import REVIEW_PERMISSION
from rollouts.review.turn_selection import BIGINT_MAX, TurnSelection, selection_summary

SETS_PER_PAGE = 20
RUNS_PER_PAGE = 25
ANSWERS_PER_PAGE = 30
LEADERBOARD_SETS_PER_PAGE = 10
DIFFERENCES_SHOWN = 60  # questions right in one run only, listed on the comparison
POLL_SECONDS = 2

T = TypeVar("T")


def _pct(fraction: float) -> float:
    return 100.0 * fraction


def _object_or_404(get: Callable[..., T], **ids: int) -> T:
    """A row by id; ids past PostgreSQL's bigint are no row, not an error."""
    if any(value > BIGINT_MAX for value in ids.values()):
        raise Http404("no such row")
    try:
        return get(**ids)
    except (ProbeSet.DoesNotExist, ProbeRun.DoesNotExist, ProbeAnswer.DoesNotExist) as exc:
        raise Http404("no such row") from exc


def _run_label(run: ProbeRun) -> str:
    return f"#{run.id} {run.model} · {run.observation}"


def _run_table(runs: Page, url: str, *, param: str) -> dict[str, Any]:
    """What the runs table needs; it refreshes itself while a run of its page answers."""
    return {
        "runs": runs,
        "runs_param": param,
        "poll": any(selectors.run_is_active(r) for r in runs),
        "poll_seconds": POLL_SECONDS,
        "poll_url": f"{url}?poll=1&{param}={runs.number}",
    }


# --- sets and runs -------------------------------------------------------------------------


@require_GET
def probe_list(request: HttpRequest) -> HttpResponse:
    return _probe_list_page(request, ProbeSetForm())


def _probe_list_page(
    request: HttpRequest, form: ProbeSetForm, *, status: int = 200
) -> HttpResponse:
    sets = Paginator(selectors.sets_newest(), SETS_PER_PAGE).get_page(request.GET.get("sets_page"))
    runs = Paginator(selectors.runs_newest(), RUNS_PER_PAGE).get_page(request.GET.get("runs_page"))
    context = {
        "sets": sets,
        "form": form,
        "can_review": request.user.has_perm(REVIEW_PERMISSION),
        **_run_table(runs, reverse("probes:probe_list"), param="runs_page"),
    }
    if request.htmx and request.GET.get("poll"):
        return render(request, "probes/partials/run_table.html", context)
    return render(request, "probes/probe_list.html", context, status=status)


@require_POST
@permission_required(REVIEW_PERMISSION, raise_exception=True)
def set_create(request: HttpRequest) -> HttpResponse:
    form = ProbeSetForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            probe_set = probe_set_create(
                filters=form.selection,
                kinds=tuple(data["kinds"]) or None,
                per_episode=data["per_episode"],
                seed=data["seed"] or 0,
                balance=data["balance"],
                name=data["name"],
                created_by=request.user,
            )
        except ProbeSetError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(
                request,
                f"Probe set {probe_set.id} built: {probe_set.questions_count} questions on "
                f"{probe_set.frames_count} frames.",
            )
            return redirect("probes:set_detail", set_id=probe_set.id)
    return _probe_list_page(request, form, status=400)


@require_GET
def set_detail(request: HttpRequest, set_id: int) -> HttpResponse:
    probe_set = _object_or_404(selectors.set_get, set_id=set_id)
    return _set_page(request, probe_set, ProbeRunForm())


def _set_page(
    request: HttpRequest, probe_set: ProbeSet, form: ProbeRunForm, *, status: int = 200
) -> HttpResponse:
    runs = Paginator(selectors.runs_newest(probe_set=probe_set), RUNS_PER_PAGE).get_page(
        request.GET.get("page")
    )
    table = _run_table(runs, reverse("probes:set_detail", args=[probe_set.id]), param="page")
    if request.htmx and request.GET.get("poll"):
        return render(request, "probes/partials/run_table.html", {**table, "hide_set": True})
    filters = TurnSelection.from_json(
        probe_set.filters if isinstance(probe_set.filters, dict) else {}
    )
    return render(
        request,
        "probes/set_detail.html",
        {
            **table,
            "set": probe_set,
            "selection": selection_summary(filters, base=TurnSelection()),
            "kinds": selectors.set_distributions(probe_set=probe_set),
            "examples": selectors.set_examples(probe_set=probe_set),
            "form": form,
            "can_review": request.user.has_perm(REVIEW_PERMISSION),
            "dominant_percent": round(100 * selectors.DOMINANT_SHARE),
        },
        status=status,
    )


@require_POST
@permission_required(REVIEW_PERMISSION, raise_exception=True)
def run_create(request: HttpRequest, set_id: int) -> HttpResponse:
    probe_set = _object_or_404(selectors.set_get, set_id=set_id)
    form = ProbeRunForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            run = probe_run_create(
                probe_set=probe_set,
                endpoint_name=data["endpoint"].name,
                model=data["model"],
                observation=data["observation"],
                concurrency=data["concurrency"],
                created_by=request.user,
            )
        except RunError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Run {run.id} started: {run.questions_total} questions.")
            return redirect("probes:run_detail", run_id=run.id)
    return _set_page(request, probe_set, form, status=400)


# --- a run ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class KindResult:
    kind: str
    accuracy: results.Accuracy
    subjects: dict[str, results.Accuracy]
    confusion: results.Confusion | None

    @property
    def matrix_rows(self) -> list[tuple[str, list[tuple[int, bool]], int]]:
        """The matrix as the page draws it: (right answer, [(count, on the diagonal)], none)."""
        m = self.confusion
        if m is None:
            return []
        return [
            (label, [(n, i == j) for j, n in enumerate(row)], m.unparsed[i])
            for i, (label, row) in enumerate(zip(m.labels, m.counts, strict=True))
        ]


def _run_results(run: ProbeRun) -> tuple[results.RunResults, list[KindResult], str]:
    records = run_answer_records(run_id=run.id)
    kinds = run.probe_set.kinds or []
    measured = results.run_results(records, kinds=kinds)
    matrices = results.confusion_matrices(records, kinds=kinds)
    rows = [
        KindResult(kind, accuracy, measured.subjects.get(kind, {}), matrices.get(kind))
        for kind, accuracy in measured.kinds.items()
    ]
    # Kinds with nothing answered have no bar to draw: their row would be chance alone.
    drawn = [r for r in rows if r.accuracy.answered]
    if not drawn:
        return measured, rows, ""
    svg = accuracy_svg(
        [KindRow(r.kind, _pct(r.accuracy.chance)) for r in drawn],
        [
            RunSeries(
                _run_label(run),
                {r.kind: _pct(r.accuracy.accuracy) for r in drawn},
                {
                    r.kind: (_pct(r.accuracy.interval[0]), _pct(r.accuracy.interval[1]))
                    for r in drawn
                },
            )
        ],
        title="Accuracy per kind over the questions answered, with 95% intervals; the dashed "
        "mark is chance",
    )
    return measured, rows, svg


@require_GET
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = _object_or_404(selectors.run_get, run_id=run_id)
    active = selectors.run_is_active(run)
    if request.htmx and request.GET.get("poll"):
        if not active:
            # The run just ended: the whole page once more, final numbers, no polling.
            return HttpResponse(status=204, headers={"HX-Refresh": "true"})
        return render(request, "probes/partials/run_body.html", _run_body(run, active))
    show = request.GET.get("show", "wrong")
    if show not in selectors.ANSWER_SHOWS:
        show = "wrong"
    kind = request.GET.get("kind", "")
    kinds = run.probe_set.kinds_with_questions
    if kind not in kinds:
        kind = ""
    answers = Paginator(selectors.run_answers(run=run, show=show, kind=kind), ANSWERS_PER_PAGE)
    page = answers.get_page(request.GET.get("page"))
    query = f"show={show}" + (f"&kind={kind}" if kind else "")
    return render(
        request,
        "probes/run_detail.html",
        {
            **_run_body(run, active),
            "at_once": selectors.run_questions_at_once(run=run),
            "answers": page,
            "show": show,
            "shows": selectors.ANSWER_SHOWS,
            "show_counts": selectors.run_answer_counts(run=run),
            "kind": kind,
            "kinds": kinds,
            "query": query,
            "next_url": f"{request.path}?{query}&page={page.number}",
            "can_review": request.user.has_perm(REVIEW_PERMISSION),
            "compare_with": selectors.runs_on_set(probe_set_id=run.probe_set_id, exclude=run.id)[
                :50
            ],
        },
    )


def _run_body(run: ProbeRun, active: bool) -> dict[str, Any]:
    measured, rows, svg = _run_results(run)
    total = run.questions_total or 0
    return {
        "run": run,
        "set": run.probe_set,
        "active": active,
        "poll_seconds": POLL_SECONDS,
        "done_percent": round(100 * min(run.answered, total) / total, 1) if total else 0,
        "overall": measured.overall,
        "kind_results": rows,
        "has_subjects": any(r.subjects for r in rows),
        "accuracy_svg": svg,
        "error_kinds": (
            selectors.run_error_kinds(run=run) if measured.overall.errors_over_limit else []
        ),
        "error_share_limit": results.ERROR_SHARE_LIMIT,
    }


@require_POST
@permission_required(REVIEW_PERMISSION, raise_exception=True)
def run_resume(request: HttpRequest, run_id: int) -> HttpResponse:
    """Ask again what a failed or canceled run left (never a question it answered)."""
    run = _object_or_404(selectors.run_get, run_id=run_id)
    if run.status not in (ProbeRun.Status.FAILED, ProbeRun.Status.CANCELED):
        messages.info(request, "Only a failed or canceled run is resumed; this one is not.")
    else:
        left = probe_run_resume(run=run)
        messages.success(request, f"Resumed: {left} chunk{pluralize(left)} of questions queued.")
    return redirect("probes:run_detail", run_id=run.id)


@require_POST
@permission_required(REVIEW_PERMISSION, raise_exception=True)
def run_cancel(request: HttpRequest, run_id: int) -> HttpResponse:
    """Stop a pending or running run, keeping what it answered (Resume asks the rest)."""
    run = _object_or_404(selectors.run_get, run_id=run_id)
    if not selectors.run_is_active(run):
        messages.info(request, "This run is not answering; nothing to cancel.")
    else:
        stopped = probe_run_cancel(run=run)
        messages.success(
            request, f"Canceled: {stopped} chunk{pluralize(stopped)} of questions stopped."
        )
    return redirect("probes:run_detail", run_id=run.id)


# --- a reviewer's marks on an answer -----------------------------------------------------------


@require_POST
@permission_required(REVIEW_PERMISSION, raise_exception=True)
def answer_flag(request: HttpRequest, answer_id: int) -> HttpResponse:
    answer = _object_or_404(selectors.answer_get, answer_id=answer_id)
    form = FlagForm(request.POST)
    if not form.is_valid():
        return HttpResponseBadRequest("flagged must be 1 or 0")
    services_review.answer_flag(answer=answer, flagged=form.cleaned_data["flagged"])
    return _review_response(request, answer, "probes/partials/answer_flag_button.html")


@require_POST
@permission_required(REVIEW_PERMISSION, raise_exception=True)
def answer_note(request: HttpRequest, answer_id: int) -> HttpResponse:
    answer = _object_or_404(selectors.answer_get, answer_id=answer_id)
    form = NoteForm(request.POST)
    if not form.is_valid():
        return HttpResponseBadRequest("; ".join(form.errors.get("note", ["invalid note"])))
    services_review.answer_note(answer=answer, note=form.cleaned_data["note"])
    return _review_response(request, answer, "probes/partials/answer_note_saved.html")


def _review_response(request: HttpRequest, answer: ProbeAnswer, template: str) -> HttpResponse:
    if not request.htmx:
        target = request.POST.get("next", "")
        if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
            target = reverse("probes:run_detail", args=[answer.run_id])
        return redirect(target)
    return render(request, template, {"answer": answer, "can_review": True})


# --- two runs --------------------------------------------------------------------------------


class CompareError(ValueError):
    """The runs asked for cannot be compared; the message says why in one line."""


def _run_ids(values: list[str]) -> list[int]:
    parts = [p.strip() for p in ",".join(values).split(",") if p.strip()]
    if len(parts) != 2:
        raise CompareError("Pick two runs of the same set: /probes/compare/?runs=A,B.")
    ids = []
    for part in parts:
        if not (part.isascii() and part.isdigit()) or len(part) > 18:
            raise CompareError(f"{part[:20]!r} is not a run id.")
        ids.append(int(part))
    if ids[0] == ids[1]:
        raise CompareError("Pick two different runs.")
    return ids


@require_GET
def compare(request: HttpRequest) -> HttpResponse:
    """`/probes/compare/?runs=A,B`: B against A (the baseline) on the questions both answered."""
    values = request.GET.getlist("runs")
    typed = ",".join(values)[:100]
    if not any(v.strip() for v in values):
        return render(request, "probes/compare.html", {"query": ""})
    try:
        ids = _run_ids(values)
    except CompareError as exc:
        return render(
            request, "probes/compare.html", {"error": str(exc), "query": typed}, status=400
        )
    base, other = (_object_or_404(selectors.run_get, run_id=i) for i in ids)
    if base.probe_set_id != other.probe_set_id:
        error = (
            f"Run #{base.id} is of set #{base.probe_set_id} and run #{other.id} of set "
            f"#{other.probe_set_id}: only runs of the same set answer the same questions."
        )
        return render(request, "probes/compare.html", {"error": error, "query": typed}, status=400)
    kinds = base.probe_set.kinds or []
    comparison = results.runs_compare(
        base=run_answer_records(run_id=base.id),
        other=run_answer_records(run_id=other.id),
        kinds=kinds,
    )
    labels = (_run_label(base), _run_label(other))
    drawn = {kind: p for kind, p in comparison.kinds.items() if p.questions}
    svg = accuracy_svg(
        [KindRow(kind, _pct(p.base.chance)) for kind, p in drawn.items()],
        [
            RunSeries(
                label,
                {k: _pct(getattr(p, side).accuracy) for k, p in drawn.items()},
                {k: tuple(_pct(x) for x in getattr(p, side).interval) for k, p in drawn.items()},
            )
            for label, side in zip(labels, ("base", "other"), strict=True)
        ],
        title="Accuracy per kind on the questions both runs answered, with 95% intervals",
    )
    differing = selectors.differing_questions(
        base=base,
        other=other,
        question_ids=[
            *(q for ids in comparison.right_only_in_base.values() for q in ids),
            *(q for ids in comparison.right_only_in_other.values() for q in ids),
        ],
        limit=DIFFERENCES_SHOWN,
    )
    return render(
        request,
        "probes/compare.html",
        {
            "query": f"{base.id},{other.id}",
            "base": base,
            "other": other,
            "set": base.probe_set,
            "labels": labels,
            "comparison": comparison,
            "accuracy_svg": svg if drawn else "",
            "differing": differing,
            "differing_total": sum(p.only_base + p.only_other for p in comparison.kinds.values()),
        },
    )


# --- the perception leaderboard --------------------------------------------------------------


@require_GET
def leaderboard(request: HttpRequest) -> HttpResponse:
    """Best finished run per (model, observation) on each set, per kind."""
    sets = Paginator(selectors.sets_with_finished_runs(), LEADERBOARD_SETS_PER_PAGE).get_page(
        request.GET.get("page")
    )
    boards = [selectors.perception_board(probe_set=probe_set) for probe_set in sets]
    return render(
        request,
        "probes/leaderboard.html",
        {"boards": boards, "sets": sets, "error_share_limit": results.ERROR_SHARE_LIMIT},
    )
