"""Pages of the review studio. Login is enforced for all of them by LoginRequiredMiddleware."""

from __future__ import annotations

import json
import re

from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.core.paginator import Paginator
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseNotModified,
    JsonResponse,
    QueryDict,
)
from django.shortcuts import redirect, render
from django.template.defaultfilters import pluralize
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.safestring import mark_safe
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from rollouts import selectors, selectors_play, selectors_review, services, services_review
from rollouts.crafter_env import ACHIEVEMENTS, KEY_MAP
from rollouts.forms import (
    BatchCreateForm,
    BulkFlagForm,
    FlagForm,
    TurnFilterForm,
    TurnNoteForm,
)
from rollouts.forms_play import ForkForm
from rollouts.frame_store import FrameStore, frame_name
from rollouts.models import Episode, RolloutBatch, Turn, TurnBulkFlag
from rollouts.scoring import crafter_score, score_text
from rollouts.selectors_baselines import batch_evaluation
from rollouts.turn_selection import EVERY_TURN, turns_selected
from studio.queue import QUEUE_UNREACHABLE

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
REVIEW_PERMISSION = "rollouts.review_turn"
BATCHES_PER_PAGE = 25
EPISODES_PER_PAGE = 100
TURNS_PER_PAGE = 50
POLL_SECONDS = 2


@require_GET
def batch_list(request: HttpRequest) -> HttpResponse:
    page = Paginator(selectors_review.batches_with_progress(), BATCHES_PER_PAGE).get_page(
        request.GET.get("page")
    )
    context = {
        "page": page,
        "poll": selectors_review.batches_any_active(),
        "poll_seconds": POLL_SECONDS,
    }
    if request.htmx:
        return render(request, "rollouts/partials/batch_table.html", context)
    return render(request, "rollouts/batch_list.html", context)


@require_http_methods(["GET", "POST"])
@permission_required(REVIEW_PERMISSION, raise_exception=True)
def batch_create(request: HttpRequest) -> HttpResponse:
    source = None
    initial = None
    source_id = request.GET.get("from", "")
    # An id PostgreSQL's bigint can hold: ASCII digits, at most 18 of them.
    if request.method == "GET" and source_id.isascii() and source_id.isdigit():
        # "Run again": the form prefilled with that batch's settings.
        source = (
            RolloutBatch.objects.filter(id=int(source_id)).first() if len(source_id) <= 18 else None
        )
        if source is not None and source.policy != RolloutBatch.Policy.IMPORTED:
            initial = BatchCreateForm.initial_from(services.batch_settings(source))
    form = BatchCreateForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        batch = services.batch_create(settings=form.rollout_settings, created_by=request.user)
        if selectors.batch_episodes_unsent(batch_id=batch.id):
            messages.warning(
                request,
                f"Batch {batch.id} saved, but {QUEUE_UNREACHABLE}; "
                "the batch will start when it is back.",
            )
        else:
            messages.success(
                request, f"Batch {batch.id} started: {batch.episodes_total} episodes queued."
            )
        return redirect("rollouts:batch_detail", batch_id=batch.id)
    return render(
        request, "rollouts/batch_new.html", {"form": form, "source": source if initial else None}
    )


@require_POST
@permission_required(REVIEW_PERMISSION, raise_exception=True)
def batch_resume(request: HttpRequest, batch_id: int) -> HttpResponse:
    batch = _batch_or_404(batch_id)
    if batch.policy == RolloutBatch.Policy.IMPORTED:
        return HttpResponseBadRequest("an imported batch has nothing to play")
    left = services.batch_resume(batch=batch)
    if left and selectors.batch_episodes_unsent(batch_id=batch.id):
        messages.warning(request, f"{QUEUE_UNREACHABLE}; the batch will start when it is back.")
    elif left:
        messages.success(request, f"Resumed: {left} unfinished episode{pluralize(left)} queued.")
    else:
        messages.info(request, "Every episode of this batch has finished; nothing to resume.")
    return redirect("rollouts:batch_detail", batch_id=batch.id)


@require_POST
@permission_required(REVIEW_PERMISSION, raise_exception=True)
def batch_cancel(request: HttpRequest, batch_id: int) -> HttpResponse:
    batch = _batch_or_404(batch_id)
    stopped = services.batch_cancel(batch=batch)
    if stopped or batch.status == RolloutBatch.Status.CANCELED:
        messages.success(request, f"Canceled: {stopped} episode{pluralize(stopped)} stopped.")
    else:
        messages.info(request, "This batch is not running; nothing to cancel.")
    return redirect("rollouts:batch_detail", batch_id=batch.id)


def _batch_or_404(batch_id: int) -> RolloutBatch:
    try:
        return selectors_review.batch_get(batch_id=batch_id)
    except RolloutBatch.DoesNotExist as exc:
        raise Http404("no such batch") from exc


@require_GET
def batch_detail(request: HttpRequest, batch_id: int) -> HttpResponse:
    batch = _batch_or_404(batch_id)
    sort = request.GET.get("sort", "seed")
    if sort not in selectors_review.EPISODE_SORTS:
        sort = "seed"
    episodes = Paginator(
        selectors_review.batch_episodes(batch_id=batch.id, sort=sort), EPISODES_PER_PAGE
    ).get_page(request.GET.get("page"))
    rates = selectors.batch_success_rates(batch_id=batch.id)
    active = selectors_review.batch_is_active(batch=batch)
    if request.htmx and not active and request.GET.get("poll"):
        # The batch just ended: load the page once more, with final rates and no polling.
        response = HttpResponse(status=204)
        response["HX-Refresh"] = "true"
        return response
    context = {
        "batch": batch,
        "episodes": episodes,
        "sort": sort,
        "sort_columns": [
            ("seed", "Seed"),
            ("steps", "Steps"),
            ("reward", "Reward"),
            ("achievements", "Achievements"),
        ],
        "rates": [(name, rates.get(name, 0.0)) for name in ACHIEVEMENTS],
        # No finished episode, no score: "—", not a 0.00% that reads like a result.
        "score": score_text(crafter_score(rates) if batch.episodes_finished else None),
        "stats": selectors_review.batch_episode_stats(batch_id=batch.id),
        "active": active,
        "poll_seconds": POLL_SECONDS,
        "settings_rows": selectors.batch_settings_rows(batch=batch),
        "unfinished": batch.episodes_total - batch.episodes_finished,
        "can_review": request.user.has_perm(REVIEW_PERMISSION),
        # Started by a training job's Evaluate: which job, and the comparison with its base.
        "evaluation": batch_evaluation(batch=batch),
        "samples_per_seed": int((batch.settings or {}).get("samples_per_seed") or 1),
    }
    if context["samples_per_seed"] > 1:
        context["seed_groups"] = selectors.batch_seed_groups(batch_id=batch.id)
    if request.htmx:
        return render(request, "rollouts/partials/batch_body.html", context)
    return render(request, "rollouts/batch_detail.html", context)


@require_GET
def episode_detail(request: HttpRequest, episode_id: int) -> HttpResponse:
    try:
        index = selectors_review.episode_index(episode_id=episode_id)
    except Episode.DoesNotExist as exc:
        raise Http404("no such episode") from exc
    try:
        turn = request.GET.get("turn", "0")
        start = int(turn) if len(turn) <= 12 else 0
    except ValueError:
        start = 0
    start = min(max(start, 0), max(index.count - 1, 0))
    can_review = request.user.has_perm(REVIEW_PERMISSION)
    forks = selectors_play.episode_forks(episode_id=episode_id)
    config = {
        "turnIndex": start,
        "canReview": can_review,
        "frameUrl": reverse("rollouts:frame_image", args=["0" * 64]),
        "turnUrl": reverse("rollouts:episode_turn", args=[episode_id, 0]),
        "flagUrl": reverse("rollouts:turn_flag", args=[0]),
        "noteUrl": reverse("rollouts:turn_note", args=[0]),
        "textUrl": reverse("rollouts:turn_text", args=[0, "model_text"]),
        "relabelUrl": reverse("rollouts:turn_relabel", args=[0]),
        "episodeUrl": reverse("rollouts:episode_detail", args=[0]),
        "keys": [list(pair) for pair in KEY_MAP],
        "forks": forks,
    }
    return render(
        request,
        "rollouts/episode_detail.html",
        {
            "episode": index.episode,
            "batch": index.episode.batch,
            "turn_count": index.count,
            # JSON escaped for a <script> element by the selector (as `json_script` does).
            "turn_index": mark_safe(index.recorded_json),
            "turn_flags": index.flagged,
            "start_frame": index.frame(start) if index.count else "",
            "viewer_config": config,
            "can_review": can_review,
            "unlocked": index.unlocked,
            "forks": forks,
            "fork_form": ForkForm(initial={"turn": start}),
            "key_map": KEY_MAP,
        },
    )


@require_GET
@never_cache
def episode_turn(request: HttpRequest, episode_id: int, index: int) -> HttpResponse:
    """One turn of the viewer, as JSON: the page carries an index, the turn at the cursor
    (and its neighbours) come from here. The page's permission: any signed-in user."""
    try:
        turn = selectors_review.episode_turn(episode_id=episode_id, index=index)
    except Turn.DoesNotExist as exc:
        raise Http404("no such turn") from exc
    return JsonResponse(turn)


@require_GET
def turn_list(request: HttpRequest) -> HttpResponse:
    form = TurnFilterForm(request.GET or None)
    filters = form.filters() if form.is_valid() else None
    if not form.is_bound:
        filters = EVERY_TURN
    sort = request.GET.get("sort", "")
    if sort not in selectors_review.TURN_SORTS:
        sort = ""
    page = count = None
    if filters is not None:
        page = selectors_review.turn_list_page(
            selection=filters,
            sort=sort,
            after=request.GET.get("after"),
            before=request.GET.get("before"),
            size=TURNS_PER_PAGE,
        )
        # The semi-join's shape: the planner's estimate of it ("about") counts the turns,
        # where for an array of episode ids it assumes a short one.
        count = selectors_review.turns_count(turns=turns_selected(filters))
    return render(
        request,
        "rollouts/turn_list.html",
        {
            "form": form,
            "page": page,
            "count": count,
            "filter_query": _query_without(request.GET, "page", "after", "before"),
            # A new sort starts at the first page: a cursor belongs to the order it came from.
            "sort_query": _query_without(request.GET, "page", "after", "before", "sort"),
            "sort": sort,
            "sort_columns": [("batch", "Batch"), ("episode", "Episode"), ("turn", "Turn")],
            "choices": selectors_review.turn_filter_choices(),
            "can_review": request.user.has_perm(REVIEW_PERMISSION),
        },
    )


@require_http_methods(["GET", "POST"])
@permission_required(REVIEW_PERMISSION, raise_exception=True)
def turns_bulk_flag(request: HttpRequest) -> HttpResponse:
    """GET shows how many turns the filter matches; POST flags or unflags all of them."""
    data = request.POST if request.method == "POST" else request.GET
    form = TurnFilterForm(data)
    flag_form = BulkFlagForm(data)
    if not form.is_valid() or not flag_form.is_valid():
        return HttpResponseBadRequest("invalid filters")
    filters = form.filters()
    flagged = flag_form.cleaned_data["set_flagged"]
    turns = turns_selected(filters)
    filter_query = _query_without(
        data, "page", "after", "before", "set_flagged", "csrfmiddlewaretoken", "sort"
    )
    if request.method == "POST":
        # Millions of turns may match: the worker flags them, this page shows its progress.
        job = services_review.turn_bulk_flag_start(
            filters=filters, flagged=flagged, user=request.user
        )
        return redirect("rollouts:turn_bulk_flag_detail", job_id=job.id)
    return render(
        request,
        "rollouts/turns_bulk_confirm.html",
        {
            "form": form,
            "filters": filters,
            "flagged": flagged,
            "count": selectors_review.turns_count(turns=turns),
            "already": selectors_review.turns_count(turns=turns.filter(flagged=flagged)),
            "filter_query": filter_query,
            "hidden": [(k, v) for k, v in data.items() if k in form.fields and v],
        },
    )


@require_GET
@permission_required(REVIEW_PERMISSION, raise_exception=True)
def turn_bulk_flag_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    """A bulk flag's progress; polls itself (htmx) until the worker is done."""
    try:
        job = selectors_review.turn_bulk_flag_get(job_id=job_id)
    except TurnBulkFlag.DoesNotExist as exc:
        raise Http404("no such bulk flag") from exc
    active = job.status in (TurnBulkFlag.Status.PENDING, TurnBulkFlag.Status.RUNNING)
    template = (
        "rollouts/partials/turn_bulk_flag_progress.html"
        if request.htmx
        else "rollouts/turn_bulk_flag.html"
    )
    return render(
        request,
        template,
        {
            "job": job,
            "active": active,
            "poll_seconds": 1,
            "list_query": selectors_review.turn_bulk_flag_list_query(job=job),
        },
    )


@require_POST
@permission_required(REVIEW_PERMISSION, raise_exception=True)
def turn_flag(request: HttpRequest, turn_id: int) -> HttpResponse:
    turn = _turn_or_404(turn_id)
    form = FlagForm(request.POST)
    if not form.is_valid():
        return HttpResponseBadRequest("flagged must be 1 or 0")
    services_review.turn_flag(turn=turn, flagged=form.cleaned_data["flagged"], user=request.user)
    return _review_response(request, turn, "rollouts/partials/turn_flag_button.html")


@require_POST
@permission_required(REVIEW_PERMISSION, raise_exception=True)
def turn_note(request: HttpRequest, turn_id: int) -> HttpResponse:
    turn = _turn_or_404(turn_id)
    form = TurnNoteForm(request.POST)
    if not form.is_valid():
        return HttpResponseBadRequest("; ".join(form.errors.get("note", ["invalid note"])))
    services_review.turn_note(turn=turn, note=form.cleaned_data["note"], user=request.user)
    return _review_response(request, turn, "rollouts/partials/turn_note_saved.html")


@require_GET
def turn_text(request: HttpRequest, turn_id: int, field: str) -> HttpResponse:
    """One text of a turn in full: the viewer receives long texts cut (`clip_for_page`)."""
    if field not in selectors_review.TURN_TEXT_FIELDS:
        raise Http404("no such text")
    try:
        text = selectors_review.turn_text(turn_id=turn_id, field=field)
    except Turn.DoesNotExist as exc:
        raise Http404("no such turn") from exc
    # Plain text, never sniffed as HTML (SECURE_CONTENT_TYPE_NOSNIFF); the viewer sets it as
    # textContent.
    return HttpResponse(text, content_type="text/plain; charset=utf-8")


def _turn_or_404(turn_id: int) -> Turn:
    try:
        return selectors_review.turn_get(turn_id=turn_id)
    except Turn.DoesNotExist as exc:
        raise Http404("no such turn") from exc


def _review_response(request: HttpRequest, turn: Turn, template: str) -> HttpResponse:
    if not request.htmx:
        target = request.POST.get("next", "")
        if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
            episode_url = reverse("rollouts:episode_detail", args=[turn.episode_id])
            target = f"{episode_url}?turn={turn.index}"
        return redirect(target)
    response = render(request, template, {"turn": turn, "can_review": True})
    # The viewer keeps its copy of the turn in step with what the server stored. The note
    # itself stays out of the header: headers are small and proxies cap them.
    event = {"id": turn.id, "flagged": turn.flagged, "note_length": len(turn.note)}
    response["HX-Trigger"] = json.dumps({"studio:turn-reviewed": event})
    return response


def _query_without(params: QueryDict, *keys: str) -> str:
    query = params.copy()
    for key in keys:
        query.pop(key, None)
    return query.urlencode()


@require_GET
def frame_image(request: HttpRequest, sha256: str) -> HttpResponse:
    """A frame PNG by its sha256. The name is derived from the hash, never from user input."""
    if not _SHA256.match(sha256):
        raise Http404("no such frame")
    etag = f'"{sha256}"'
    if not selectors.frame_exists(sha256=sha256):
        raise Http404("no such frame")
    if request.headers.get("If-None-Match") == etag:
        # Content-addressed: a client holding this ETag holds exactly these bytes.
        response: HttpResponse = HttpResponseNotModified()
    else:
        try:
            png = FrameStore().read(frame_name(sha256))
        except FileNotFoundError as exc:
            raise Http404("frame file missing") from exc
        response = HttpResponse(png, content_type="image/png")
    response["Cache-Control"] = "private, max-age=31536000, immutable"
    response["ETag"] = etag
    return response
