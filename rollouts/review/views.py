"""Review pages: the episode viewer, the turn list, flags, notes, bulk flags and the turn
list's bulk actions. Login is enforced by LoginRequiredMiddleware; changing anything needs
`rollouts.review_turn`."""

from __future__ import annotations

import json

from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.core.exceptions import PermissionDenied
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    JsonResponse,
    QueryDict,
)
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.safestring import mark_safe
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from rollouts.game.crafter_env import KEY_MAP
from rollouts.models import REVIEW_PERMISSION, Episode, RolloutBatch, Turn, TurnBulkFlag
from rollouts.play import selectors as selectors_play
from rollouts.play.forms import ForkForm
from rollouts.review import selectors as selectors_review
from rollouts.review import services as services_review
from rollouts.review import viewer
from rollouts.review.forms import (
    TURN_ACTIONS,
    TURN_BULK_FIELDS,
    BulkFlagForm,
    FlagForm,
    TurnBulkForm,
    TurnFilterForm,
    TurnNoteForm,
    turn_list_query,
)
from rollouts.review.turn_selection import (
    EVERY_TURN,
    TurnSelection,
    selection_summary,
    turns_selected,
)

TURNS_PER_PAGE = 50


@require_GET
def episode_detail(request: HttpRequest, episode_id: int) -> HttpResponse:
    try:
        index = viewer.episode_index(episode_id=episode_id)
    except Episode.DoesNotExist as exc:
        raise Http404("no such episode") from exc
    try:
        turn = request.GET.get("turn", "0")
        start = int(turn) if len(turn) <= 12 else 0
    except ValueError:
        start = 0
    episode = index.episode
    # An episode a worker has still to record the turn it is opened at (a new fork opens at
    # its fork turn) shows that it is waiting, and asks again every second until it can show
    # it. A person's game waits for its player instead: its page says where it is played.
    waiting = (
        episode.status in (Episode.Status.PENDING, Episode.Status.RUNNING)
        and episode.batch.policy != RolloutBatch.Policy.HUMAN
        and (index.count == 0 or (episode.forked_from_id is not None and start >= index.count))
    )
    if request.htmx and request.headers.get("HX-Trigger") == "episode-waiting":
        if waiting:
            return render(request, "rollouts/partials/episode_waiting.html", {"episode": episode})
        # Its turns are here (or it ended without them): the whole page, at the same address.
        return HttpResponse(headers={"HX-Refresh": "true"})
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
            "episode": episode,
            "batch": episode.batch,
            "waiting": waiting,
            # A model or baseline episode still playing: its live box (no query: the index
            # has what it shows).
            "live": not waiting and viewer.episode_plays(episode),
            "turns": index.count,
            "turn_count": index.count,
            # JSON escaped for a <script> element by the selector (as `json_script` does).
            "turn_index": mark_safe(index.recorded_json),
            "turn_flags": index.flagged,
            "start_frame": index.frame(start) if index.count else "",
            "viewer_config": config,
            "can_review": can_review,
            "unlocked": index.unlocked,
            "advantages": viewer.episode_advantages(episode=episode),
            "forks": forks,
            "fork_form": ForkForm(initial={"turn": start}),
            "key_map": KEY_MAP,
        },
    )


@require_GET
@never_cache
def episode_live(request: HttpRequest, episode_id: int) -> HttpResponse:
    """Where a running episode stands (its step, turns recorded, calls and tokens), asked for
    every 2 s by its viewer while it plays. The page's permission: any signed-in user."""
    try:
        live = viewer.episode_live(episode_id=episode_id)
    except Episode.DoesNotExist as exc:
        raise Http404("no such episode") from exc
    return render(request, "rollouts/partials/episode_live.html", live)


@require_GET
@never_cache
def episode_turn(request: HttpRequest, episode_id: int, index: int) -> HttpResponse:
    """One turn of the viewer, as JSON: the page carries an index, the turn at the cursor
    (and its neighbours) come from here. The page's permission: any signed-in user."""
    try:
        # `whole`: its long texts uncut, for the viewer's "Show all" of tool calls.
        turn = viewer.episode_turn(
            episode_id=episode_id, index=index, whole=request.GET.get("whole") == "1"
        )
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
            # The bar's actions on ticked turns (or on every match), and the list's filters
            # and order they carry to the confirmation and back.
            "bulk_actions": _bulk_actions(request),
            "bulk_hidden": [
                (k, v) for k, v in request.GET.items() if v and (k in form.fields or k == "sort")
            ],
        },
    )


def _bulk_actions(request: HttpRequest) -> list[tuple[str, str]]:
    """The turn list's bulk actions this user may take: (name, the bar's words)."""
    if not request.user.has_perm(REVIEW_PERMISSION):
        return []
    actions = [("flag", "Flag"), ("unflag", "Unflag"), ("note", "Note…")]
    for collection in services_review.turn_collections():
        if request.user.has_perm(collection.permission):
            actions.append((collection.noun, f"Add to {collection.noun}…"))
    return actions


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
            # Every filter that narrows the list, named as the declaration names it.
            "summary": selection_summary(filters),
            "flagged": flagged,
            "count": selectors_review.turns_count(turns=turns),
            "already": selectors_review.turns_count(turns=turns.filter(flagged=flagged)),
            "filter_query": filter_query,
            "hidden": [(k, v) for k, v in data.items() if k in form.fields and v],
        },
    )


# What each bulk action is refused past (none: the worker takes any number).
_BULK_LIMITS = {"note": services_review.BULK_NOTE_MAX_TURNS}


@require_http_methods(["GET", "POST"])
@permission_required(REVIEW_PERMISSION, raise_exception=True)
def turns_bulk(request: HttpRequest) -> HttpResponse:
    """The turn list's bar: flag, unflag, note or add to a dataset the ticked turns, or every
    turn the filters match. GET asks to confirm, naming how many; POST does it (flags on the
    worker, as the bulk flag does; a note or an addition here, bounded)."""
    data = request.POST if request.method == "POST" else request.GET
    form = TurnBulkForm(data)
    # The list as it was (filters and order): where Cancel and a finished action go back to.
    list_query = _query_without(
        data, "page", "after", "before", "csrfmiddlewaretoken", *TURN_BULK_FIELDS
    )
    back = reverse("rollouts:turn_list") + (f"?{list_query}" if list_query else "")
    context: dict = {"form": form, "back": back, "error": ""}
    if not form.is_valid():
        context["error"] = " ".join(
            f"{'' if name == '__all__' else name + ': '}{' '.join(errors)}"
            for name, errors in form.errors.items()
        )
        return render(request, "rollouts/turns_bulk_action.html", context, status=400)
    action, selection, collection = form.cleaned_data["action"], form.selection, form.collection
    if collection is not None and not request.user.has_perm(collection.permission):
        raise PermissionDenied
    if request.method == "POST":
        try:
            if action in ("flag", "unflag"):
                job = services_review.turn_bulk_flag_start(
                    filters=selection, flagged=action == "flag", user=request.user
                )
                return redirect("rollouts:turn_bulk_flag_detail", job_id=job.id)
            if action == "note":
                done = services_review.turns_note_set(
                    selection=selection, note=form.cleaned_data["note"], user=request.user
                )
                word = "Note set on" if form.cleaned_data["note"] else "Note cleared on"
                messages.success(request, f"{word} {done:,} turn{'s' if done != 1 else ''}.")
            else:
                target = form.cleaned_data["target"]
                if target is None:
                    raise ValueError(f"{collection.noun}: choose one to add the turns to")
                added = collection.add(target_id=target, selection=selection, user=request.user)
                name = dict(collection.choices()).get(target, f"#{target}")
                messages.success(
                    request,
                    f"Added {added:,} turn{'s' if added != 1 else ''} to {collection.noun} "
                    f"{name!r}.",
                )
        except ValueError as exc:
            context["error"] = str(exc)
        else:
            return redirect(back)
    count = selectors_review.turns_count(turns=turns_selected(selection))
    limit = collection.most if collection is not None else _BULK_LIMITS.get(action)
    context.update(
        {
            "action": action,
            "verb": TURN_ACTIONS.get(action, "Add"),
            "collection": collection,
            "targets": collection.choices() if collection is not None else [],
            "scope": form.cleaned_data["scope"] or "selection",
            "count": count,
            "limit": limit,
            "too_many": limit is not None and count.value > limit,
            "summary": selection_summary(selection),
            # Everything but the note and the target, which the confirmation asks for.
            "hidden": [
                (k, v)
                for k in data
                if k in form.fields and k not in ("note", "target")
                for v in data.getlist(k)
                if v
            ],
        }
    )
    return render(
        request, "rollouts/turns_bulk_action.html", context, status=400 if context["error"] else 200
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
            "list_query": turn_list_query(TurnSelection.from_json(job.filters)),
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
    if field not in viewer.TURN_TEXT_FIELDS:
        raise Http404("no such text")
    try:
        text = viewer.turn_text(turn_id=turn_id, field=field)
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
