"""Pages of the review studio. Login is enforced for all of them by LoginRequiredMiddleware."""

from __future__ import annotations

import logging
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
)
from django.shortcuts import redirect, render
from django.template.defaultfilters import pluralize
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from rollouts import selectors, selectors_spend
from rollouts.forms import BatchCreateForm
from rollouts.game.crafter_env import ACHIEVEMENTS
from rollouts.game.scoring import crafter_score, score_text
from rollouts.models import REVIEW_PERMISSION, RolloutBatch
from rollouts.recording import services
from rollouts.recording.frame_store import FrameStore, FrameUnreadable, frame_name
from studio.queue import QUEUE_UNREACHABLE

logger = logging.getLogger(__name__)

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
REVIEW_PERMISSION = REVIEW_PERMISSION
BATCHES_PER_PAGE = 25
EPISODES_PER_PAGE = 100
POLL_SECONDS = 2


@require_GET
def batch_list(request: HttpRequest) -> HttpResponse:
    page = Paginator(selectors.batches_with_progress(), BATCHES_PER_PAGE).get_page(
        request.GET.get("page")
    )
    page.object_list = list(page.object_list)
    selectors.batches_count_playing(page.object_list)
    page.object_list = selectors_spend.batches_with_spend(page.object_list)
    context = {
        "page": page,
        "poll": selectors.batches_any_active(),
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
        request,
        "rollouts/batch_new.html",
        {
            "form": form,
            "source": source if initial else None,
            # Sent back with errors: the estimate of what was typed (else htmx asks on load).
            "estimate": _estimate(form) if form.is_bound else None,
        },
    )


@require_GET
@permission_required(REVIEW_PERMISSION, raise_exception=True)
def batch_estimate(request: HttpRequest) -> HttpResponse:
    """What the batch form's values would cost: the form asks again as it changes (htmx)."""
    return render(
        request,
        "rollouts/partials/batch_estimate.html",
        {"estimate": _estimate(BatchCreateForm(request.GET))},
    )


def _estimate(form: BatchCreateForm) -> dict[str, object]:
    if not form.is_valid():
        # Each field still wrong, named: the box lists them and the form marks them
        # (rollouts/batch_form.js) before anything is sent.
        errors = [
            {
                "name": name,
                "label": form[name].label if name in form.fields else "Form",
                "messages": list(messages),
            }
            for name, messages in form.errors.items()
        ]
        return {
            "incomplete": True,
            "errors": errors,
            "by_field": {e["name"]: e["messages"] for e in errors},
        }
    return {"batch": selectors_spend.batch_estimate(settings=form.rollout_settings)}


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
        return selectors.batch_get(batch_id=batch_id)
    except RolloutBatch.DoesNotExist as exc:
        raise Http404("no such batch") from exc


@require_GET
def batch_detail(request: HttpRequest, batch_id: int) -> HttpResponse:
    batch = _batch_or_404(batch_id)
    selectors.batches_count_playing([batch])
    sort = request.GET.get("sort", "seed")
    if sort not in selectors.EPISODE_SORTS:
        sort = "seed"
    episodes = Paginator(
        selectors.batch_episodes(batch_id=batch.id, sort=sort), EPISODES_PER_PAGE
    ).get_page(request.GET.get("page"))
    prices = selectors_spend.batch_prices(batch=batch)
    counts = selectors.batch_episode_counts(batch_id=batch.id)
    episodes.object_list = selectors_spend.episodes_with_spend(episodes.object_list, prices=prices)
    rates = selectors.batch_success_rates(batch_id=batch.id)
    active = selectors.batch_is_active(batch=batch)
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
        "stats": selectors.batch_episode_stats(batch_id=batch.id),
        "takeovers": selectors.batch_takeovers(batch_id=batch.id),
        "counts": counts,
        "shares": selectors.episode_shares(counts),
        "priced": prices is not None,
        "spend": selectors_spend.spend_shown(
            value=selectors_spend.batch_spend(batch=batch, prices=prices), prices=prices
        ),
        "active": active,
        "poll_seconds": POLL_SECONDS,
        "settings_rows": selectors.batch_settings_rows(batch=batch),
        "resumable": selectors.batch_episodes_resumable(batch=batch),
        "idle": selectors.batch_is_idle(batch=batch),
        "can_review": request.user.has_perm(REVIEW_PERMISSION),
        "samples_per_seed": int((batch.settings or {}).get("samples_per_seed") or 1),
    }
    if context["samples_per_seed"] > 1:
        context["seed_groups"] = selectors.batch_seed_groups(batch_id=batch.id)
    if request.htmx:
        return render(request, "rollouts/partials/batch_body.html", context)
    return render(request, "rollouts/batch_detail.html", context)


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
        except FrameUnreadable as exc:
            # Storage out of reach is not the page's fault: one line, and when to ask again.
            logger.warning("%s", exc)
            unavailable = HttpResponse(str(exc), status=503, content_type="text/plain")
            unavailable["Retry-After"] = "5"
            return unavailable
        response = HttpResponse(png, content_type="image/png")
    response["Cache-Control"] = "private, max-age=31536000, immutable"
    response["ETag"] = etag
    return response
