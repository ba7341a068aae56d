"""Reads for the batch pages: the batch list, a batch and its episodes."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import (
    Avg,
    BooleanField,
    Count,
    Exists,
    ExpressionWrapper,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
)
from django.db.models.functions import Coalesce
from django.utils import timezone

from rollouts.game.scoring import crafter_score, score_percent, success_rates
from rollouts.jobs import EPISODE
from rollouts.models import Episode, Frame, RolloutBatch, Turn
from rollouts.recording.recorder import EPISODE_COUNTERS, batch_counters_of
from rollouts.selectors_spend import batch_prices, batch_spend
from studio.jobs import most_at_once
from studio.models import Endpoint
from studio.spend import spend_json


def batch_episode_counts(*, batch_id: int) -> dict[str, int]:
    """Episodes by status; `ended` is finished, failed and canceled (the batch's counter
    `episodes_failed` holds both of the last two)."""
    counts = Episode.objects.filter(batch_id=batch_id).aggregate(
        total=Count("id"),
        finished=Count("id", filter=Q(status=Episode.Status.FINISHED)),
        failed=Count("id", filter=Q(status=Episode.Status.FAILED)),
        canceled=Count("id", filter=Q(status=Episode.Status.CANCELED)),
    )
    counts["ended"] = counts["finished"] + counts["failed"] + counts["canceled"]
    return counts


def episode_shares(counts: dict[str, int]) -> dict[str, float]:
    """Finished, failed and canceled in percent of all episodes (the stacked progress bar)."""
    total = counts["total"] or 1
    return {
        status: round(100 * counts[status] / total, 2)
        for status in ("finished", "failed", "canceled")
    }


def batch_episodes_resumable(*, batch: RolloutBatch) -> int:
    """What the batch page's Resume would play again: the episodes of an ended batch that did
    not finish (failed or canceled). A pending or running batch is still being played (the
    requeue beat re-sends what a dead worker held); a person's game and an import have nothing
    to resume."""
    if batch.status in (RolloutBatch.Status.PENDING, RolloutBatch.Status.RUNNING):
        return 0
    if not batch.policy_kind.played_by_worker:
        return 0
    return Episode.objects.filter(batch_id=batch.id).exclude(status=Episode.Status.FINISHED).count()


def batch_success_rates(*, batch_id: int) -> dict[str, float]:
    achievements = Episode.objects.filter(
        batch_id=batch_id, status=Episode.Status.FINISHED
    ).values_list("achievements", flat=True)
    return success_rates(a.keys() for a in achievements)


def batch_summary(*, batch: RolloutBatch) -> dict[str, Any]:
    """The JSON line `rollout` prints last, plus model-call counters."""
    finished = Episode.objects.filter(batch=batch, status=Episode.Status.FINISHED)
    agg = finished.aggregate(
        mean_steps=Avg("steps"),
        mean_achievements=Avg("achievement_count"),
        tool_calls=Sum("tool_calls"),
    )
    counts = batch_episode_counts(batch_id=batch.id)
    # Of the batch's model errors, those that were unusable answers rather than failed calls.
    bad_outputs = Episode.objects.filter(batch=batch).aggregate(n=Sum("bad_outputs"))["n"]
    batch.refresh_from_db()
    # Every request sent, counted by the batch's own counters: canceled and failed
    # episodes' calls included. Spend only where the endpoint has prices (docs/recording.md).
    spend = batch_spend(batch=batch, prices=batch_prices(batch=batch))
    return {
        "batch_id": batch.id,
        "episodes": counts["total"],
        "finished": counts["finished"],
        "failed": counts["failed"],
        "canceled": counts["canceled"],
        "mean_steps": round(agg["mean_steps"] or 0.0, 2),
        "mean_achievements": round(agg["mean_achievements"] or 0.0, 3),
        "crafter_score": score_percent(crafter_score(batch_success_rates(batch_id=batch.id))),
        "total_tool_calls": agg["tool_calls"] or 0,
        "model_calls": batch.model_calls,
        "model_errors": batch.model_errors,
        "bad_outputs": bad_outputs or 0,
        "model_retries": batch.model_retries,
        "prompt_tokens": batch.prompt_tokens,
        "completion_tokens": batch.completion_tokens,
        **({"spend": spend_json(spend)} if spend is not None else {}),
        "status": batch.status,
        **_sample_summary(batch=batch),
    }


def _sample_summary(*, batch: RolloutBatch) -> dict[str, Any]:
    samples = int((batch.settings or {}).get("samples_per_seed") or 1)
    if samples == 1:
        return {}
    groups = batch_seed_groups(batch_id=batch.id)
    best = [g["best_achievements"] for g in groups if g["finished"]]
    return {
        "samples_per_seed": samples,
        # best-of-K: the mean over seeds of each seed's best episode
        "mean_best_achievements": round(sum(best) / len(best), 3) if best else 0.0,
    }


def batch_seed_groups(*, batch_id: int) -> list[dict[str, Any]]:
    """Per seed, its samples' best and mean (finished episodes): the K samples as a group."""
    finished = Q(status=Episode.Status.FINISHED)
    return list(
        Episode.objects.filter(batch_id=batch_id)
        .values("seed")
        .annotate(
            samples=Count("id"),
            finished=Count("id", filter=finished),
            best_achievements=Max("achievement_count", filter=finished),
            mean_achievements=Avg("achievement_count", filter=finished),
            best_reward=Max("total_reward", filter=finished),
            mean_reward=Avg("total_reward", filter=finished),
        )
        .order_by("seed")
    )


# The rows of the options a kind uses (`PolicyKind.options`), in the page's order:
# (option, key in the stored settings, label, unit).
_SETTING_ROWS = (
    ("actions", "actions", "Actions", ""),
    ("model", "model", "Model", ""),
    ("endpoint", "base_url", "Endpoint", ""),
    ("observation_mode", "observation_mode", "Observation", ""),
    ("history_frames", "history_frames", "History frames", ""),
    ("image_detail", "image_detail", "Image detail", ""),
    ("temperature", "temperature", "Temperature", ""),
    ("max_tokens", "max_tokens", "Max tokens", ""),
    ("on_bad_output", "on_bad_output", "On bad output", ""),
    ("max_retries", "max_retries", "Retries", ""),
    ("request_timeout", "request_timeout", "Request timeout", " s"),
    ("concurrency", "concurrency", "Concurrency", " requests in flight"),
    ("requests_per_minute", "requests_per_minute", "Requests per minute", ""),
)


def batch_settings_rows(*, batch: RolloutBatch) -> list[tuple[str, str]]:
    """The batch's settings as (label, value) rows: only those that apply to its policy."""
    from rollouts.rollout_settings import seeds_spec

    data = batch.settings or {}
    rows = [
        ("Policy", batch.policy),
        ("Seeds", seeds_spec(batch.seeds) if batch.seeds else "—"),
        ("Samples per seed", str(data.get("samples_per_seed") or 1)),
        ("Steps", str(batch.step_limit)),
        ("Image size", f"{batch.image_size} px"),
    ]
    used = batch.policy_kind.options
    for option, key, label, unit in _SETTING_ROWS:
        if option not in used:
            continue
        if key == "actions":
            rows.append((label, " ".join(data.get("actions") or ())))
        else:
            value = data.get(key, "")
            if key == "requests_per_minute" and not value:
                value, unit = "no limit", ""
            if key == "concurrency" and value != "":
                value, unit = _concurrency_got(batch=batch, requested=value), ""
            rows.append((label, f"{value}{unit}" if value != "" else "—"))
    extra = data.get("extra") or {}
    for own in batch.policy_kind.own_options:
        rows.append((own.title, str(extra.get(own.name, own.default))))
    return rows


def _concurrency_got(*, batch: RolloutBatch, requested: int) -> str:
    """The concurrency asked for, and the one the workers gave: each episode makes one call
    at a time, so as many episodes at once as calls in flight (`studio.jobs.most_at_once`)."""
    text = f"{requested} requested"
    at_once = most_at_once(Episode.objects.filter(batch=batch))
    if at_once:
        text += f"; at most {at_once} episode{'' if at_once == 1 else 's'} played at once"
    return text


def frame_exists(*, sha256: str) -> bool:
    return Frame.objects.filter(sha256=sha256).exists()


def batch_episodes_unsent(*, batch_id: int) -> int:
    """Pending episodes whose message never reached the broker (it was down)."""
    return EPISODE.unsent(batch_id=batch_id)


ACTIVE_BATCH_STATUSES = (RolloutBatch.Status.PENDING, RolloutBatch.Status.RUNNING)


def batches_with_progress() -> QuerySet[RolloutBatch]:
    """Newest first, each with the mean achievement count of its finished episodes, how many
    of its episodes were canceled, and its endpoint's prices (see `batches_with_spend`)."""
    # Correlated subqueries: computed for the page's batches only, not grouped over all.
    mean = (
        Episode.objects.filter(batch=OuterRef("pk"), status=Episode.Status.FINISHED)
        .order_by()
        .values("batch")
        .annotate(mean=Avg("achievement_count"))
        .values("mean")
    )
    canceled = (
        Episode.objects.filter(batch=OuterRef("pk"), status=Episode.Status.CANCELED)
        .order_by()
        .values("batch")
        .annotate(n=Count("id"))
        .values("n")
    )
    endpoint = Endpoint.objects.filter(name=OuterRef("endpoint_name"), kind=Endpoint.Kind.CHAT)
    return (
        RolloutBatch.objects.select_related("created_by")
        .annotate(
            mean_achievements=Subquery(mean),
            canceled=Coalesce(Subquery(canceled), 0),
            input_price=Subquery(endpoint.values("input_price_per_million")[:1]),
            output_price=Subquery(endpoint.values("output_price_per_million")[:1]),
            idle=ExpressionWrapper(_human_idle(), output_field=BooleanField()),
        )
        .order_by("-created_at", "-id")
    )


def batches_count_playing(batches: Iterable[RolloutBatch]) -> None:
    """Add to each active model batch's counters, for the page, those of its episodes still
    playing: an episode counts its calls on its row with every turn, and on its batch when it
    ends. The pages then show every call within seconds of it."""
    batches = [
        batch
        for batch in batches
        if batch.status in ACTIVE_BATCH_STATUSES and batch.policy_kind.calls_model
    ]
    if not batches:
        return
    playing = (
        Episode.objects.filter(batch__in=batches, status=Episode.Status.RUNNING)
        .order_by()
        .values("batch_id")
        .annotate(**{name: Sum(name) for name in EPISODE_COUNTERS})
    )
    by_batch = {row.pop("batch_id"): row for row in playing}
    for batch in batches:
        if batch.id in by_batch:
            for name, value in batch_counters_of(by_batch[batch.id]).items():
                setattr(batch, name, getattr(batch, name) + value)


def _human_idle() -> Q:
    """A person's game (or human fork) left open: running, but no key pressed (an episode's
    heartbeat is its last turn) nor the batch created within STUDIO_HUMAN_IDLE_SECONDS. Nobody
    may ever come back to it, so the pages stop counting it as running and stop polling."""
    since = timezone.now() - timedelta(seconds=settings.STUDIO_HUMAN_IDLE_SECONDS)
    played = Episode.objects.filter(batch=OuterRef("pk"), heartbeat_at__gte=since)
    return Q(
        Q(policy=RolloutBatch.Policy.HUMAN, status__in=ACTIVE_BATCH_STATUSES, created_at__lt=since),
        ~Exists(played),
    )


def batches_any_active() -> bool:
    return (
        RolloutBatch.objects.filter(status__in=ACTIVE_BATCH_STATUSES)
        .exclude(_human_idle())
        .exists()
    )


def batch_get(*, batch_id: int) -> RolloutBatch:
    return RolloutBatch.objects.select_related("created_by", "evaluates").get(id=batch_id)


def batch_is_idle(*, batch: RolloutBatch) -> bool:
    """A person's game left open (see `_human_idle`)."""
    if batch.policy != RolloutBatch.Policy.HUMAN or batch.status not in ACTIVE_BATCH_STATUSES:
        return False
    return RolloutBatch.objects.filter(_human_idle(), id=batch.id).exists()


def batch_is_active(*, batch: RolloutBatch) -> bool:
    return batch.status in ACTIVE_BATCH_STATUSES and not batch_is_idle(batch=batch)


def batch_episodes(*, batch_id: int, sort: str) -> QuerySet[Episode]:
    ordering = EPISODE_SORTS.get(sort, EPISODE_SORTS["seed"])
    # Errors as the turns recorded them (a failed call or an unusable answer each).
    turn_errors = (
        Turn.objects.filter(episode=OuterRef("pk"))
        .exclude(error_kind="", error="")
        .order_by()
        .values("episode")
        .annotate(n=Count("id"))
        .values("n")
    )
    return (
        Episode.objects.filter(batch_id=batch_id)
        .defer("achievements", "claim_token")
        .annotate(turn_errors=Coalesce(Subquery(turn_errors), 0))
        .order_by(*ordering)
    )


def batch_takeovers(*, batch_id: int) -> list[dict[str, Any]]:
    """The episodes whose worker was lost and that were taken over, by the minute it was
    noticed: how many, and the turns they resumed from (the batch page says so, rather than
    "running" with nothing moving)."""
    groups: dict[Any, dict[str, Any]] = {}
    for lost_at, turn in (
        Episode.objects.filter(batch_id=batch_id, lost_worker_at__isnull=False)
        .order_by("lost_worker_at")
        .values_list("lost_worker_at", "resumed_from_turn")
    ):
        minute = timezone.localtime(lost_at).replace(second=0, microsecond=0)
        group = groups.setdefault(minute, {"at": minute, "episodes": 0, "turns": []})
        group["episodes"] += 1
        if turn is not None:
            group["turns"].append(turn)
    for group in groups.values():
        turns = group.pop("turns")
        group["first_turn"] = min(turns) if turns else None
        group["last_turn"] = max(turns) if turns else None
    return list(groups.values())


def batch_episode_stats(*, batch_id: int) -> dict[str, float | None]:
    stats = Episode.objects.filter(batch_id=batch_id, status=Episode.Status.FINISHED).aggregate(
        mean_steps=Avg("steps"),
        mean_reward=Avg("total_reward"),
        mean_achievements=Avg("achievement_count"),
    )
    stats["mean_latency_ms"] = Turn.objects.filter(
        episode__batch_id=batch_id, latency_ms__gt=0
    ).aggregate(m=Avg("latency_ms"))["m"]
    return stats


# Sort keys a user may pick on the batch page -> the ORM ordering they stand for.
EPISODE_SORTS: dict[str, tuple[str, ...]] = {
    "seed": ("seed", "id"),
    "-seed": ("-seed", "-id"),
    "steps": ("steps", "seed"),
    "-steps": ("-steps", "seed"),
    "reward": ("total_reward", "seed"),
    "-reward": ("-total_reward", "seed"),
    "achievements": ("achievement_count", "seed"),
    "-achievements": ("-achievement_count", "seed"),
}
