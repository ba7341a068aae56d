"""Pages and actions of human play, forks and relabels.

Viewers look; the review permission plays, forks and relabels. A game is played by the
person who started it (or a superuser): a second player would race the first key for key.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import permission_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import get_token
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from rollouts.game.crafter_env import KEY_MAP
from rollouts.models import REVIEW_PERMISSION, Episode, RolloutBatch, Turn
from rollouts.play import forks as services_fork
from rollouts.play import selectors as selectors_play
from rollouts.play import services as services_play
from rollouts.play.forms import ForkForm, PlayNewForm, RelabelForm
from rollouts.review import services as services_review
from rollouts.rollout_settings import HUMAN_POLICY, SettingsError


def _episode_or_404(episode_id: int) -> Episode:
    try:
        return Episode.objects.select_related("batch", "forked_from").get(id=episode_id)
    except Episode.DoesNotExist as exc:
        raise Http404("no such episode") from exc


def _error(message: str, status: int = 400) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def _may_play(request: HttpRequest, episode: Episode) -> bool:
    user = request.user
    return user.is_superuser or (
        user.has_perm(REVIEW_PERMISSION) and episode.batch.created_by_id == user.id
    )


@require_http_methods(["GET", "POST"])
@permission_required(REVIEW_PERMISSION, raise_exception=True)
def play_new(request: HttpRequest) -> HttpResponse:
    form = PlayNewForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            settings = services_play.play_settings(
                seed=data["seed"], steps=data["steps"], image_size=data["image_size"]
            )
        except SettingsError as exc:
            form.add_error(None, str(exc))
        else:
            episode = services_play.play_start(settings=settings, user=request.user)
            return redirect("rollouts:play", episode_id=episode.id)
    return render(request, "rollouts/play_new.html", {"form": form})


@require_GET
# Back from the viewer after "End the game here" asks again: a kept copy shows a game over as
# running, its turn count behind the one recorded.
@never_cache
def play(request: HttpRequest, episode_id: int) -> HttpResponse:
    episode = _episode_or_404(episode_id)
    if episode.batch.policy != RolloutBatch.Policy.HUMAN:
        return redirect("rollouts:episode_detail", episode_id=episode.id)
    state = selectors_play.play_state(episode=episode)
    may_play = _may_play(request, episode)
    config = {
        "state": state,
        "canPlay": may_play,
        "keys": [list(pair) for pair in KEY_MAP],
        "stepUrl": reverse("rollouts:play_step", args=[episode.id]),
        "frameUrl": reverse("rollouts:frame_image", args=["0" * 64]),
        "csrf": get_token(request),
    }
    return render(
        request,
        "rollouts/play.html",
        {
            "episode": episode,
            "batch": episode.batch,
            "state": state,
            "may_play": may_play,
            "key_map": KEY_MAP,
            "play_config": config,
        },
    )


@require_POST
@permission_required(REVIEW_PERMISSION, raise_exception=True)
def play_step(request: HttpRequest, episode_id: int) -> HttpResponse:
    episode = _episode_or_404(episode_id)
    if not _may_play(request, episode):
        return _error("this game is played by the person who started it; fork it to play", 403)
    try:
        turn = int(request.POST.get("turn", ""))
    except ValueError:
        return _error("turn: a number is needed")
    try:
        result = services_play.play_step(
            episode_id=episode.id, action=request.POST.get("action", "")[:40], turn=turn
        )
    except services_play.PlayError as exc:
        return _error(str(exc), 409)
    state = selectors_play.play_state_of(
        episode=result.episode, frame=result.frame, turns=result.turns
    )
    state.update(
        {"duplicate": result.duplicate, "reward": result.reward, "unlocked": result.unlocked}
    )
    return JsonResponse(state)


@require_POST
@permission_required(REVIEW_PERMISSION, raise_exception=True)
def play_end(request: HttpRequest, episode_id: int) -> HttpResponse:
    episode = _episode_or_404(episode_id)
    if not _may_play(request, episode):
        raise Http404("not your game")
    try:
        services_play.play_end(episode_id=episode.id)
    except services_play.PlayError as exc:
        messages.error(request, str(exc))
    return redirect("rollouts:episode_detail", episode_id=episode.id)


@require_POST
@permission_required(REVIEW_PERMISSION, raise_exception=True)
def episode_fork(request: HttpRequest, episode_id: int) -> HttpResponse:
    source = _episode_or_404(episode_id)
    form = ForkForm(request.POST)
    back = f"{reverse('rollouts:episode_detail', args=[source.id])}?turn="
    if not form.is_valid():
        errors = "; ".join(str(e) for errs in form.errors.values() for e in errs)
        messages.error(request, f"Fork not made: {errors}")
        return redirect(back + str(request.POST.get("turn", "0"))[:10])
    data = form.cleaned_data
    try:
        settings = services_fork.fork_settings(
            source=source, settings=form.rollout_settings, steps=data.get("steps")
        )
        episode = services_fork.episode_fork(
            source=source,
            turn=data["turn"],
            settings=settings,
            with_correction=data["with_correction"],
            created_by=request.user,
        )
    except (services_fork.ForkError, SettingsError) as exc:
        messages.error(request, f"Fork not made: {exc}")
        return redirect(back + str(data["turn"]))
    # The fork opens at the turn it was made at, not at its replayed opening; until a worker
    # has recorded that turn, the page says so and asks again on its own.
    at_fork = f"{reverse('rollouts:episode_detail', args=[episode.id])}?turn={data['turn']}"
    if episode.status == Episode.Status.FAILED:
        messages.error(request, f"Fork failed: {episode.error}")
        return redirect(at_fork)
    if settings.policy == HUMAN_POLICY:
        return redirect("rollouts:play", episode_id=episode.id)
    messages.success(
        request, f"Fork started: episode {episode.id} replays turns 0-{data['turn'] - 1} first."
    )
    return redirect(at_fork)


@require_POST
@permission_required(REVIEW_PERMISSION, raise_exception=True)
def turn_relabel(request: HttpRequest, turn_id: int) -> HttpResponse:
    try:
        turn = Turn.objects.get(id=turn_id)
    except Turn.DoesNotExist as exc:
        raise Http404("no such turn") from exc
    form = RelabelForm(request.POST)
    if not form.is_valid():
        return _error("; ".join(str(e) for errs in form.errors.values() for e in errs))
    if form.cleaned_data["remove"]:
        services_review.turn_relabel_remove(turn=turn)
        return JsonResponse({"id": turn.id, "relabel": None})
    try:
        relabel = services_review.turn_relabel(
            turn=turn,
            actions=form.cleaned_data["actions"],
            reason=form.cleaned_data["reason"],
            user=request.user,
        )
    except ValueError as exc:
        return _error(str(exc))
    return JsonResponse({"id": turn.id, "relabel": selectors_play.relabel_json(relabel)})
