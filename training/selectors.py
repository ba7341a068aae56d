"""Reads for training jobs: lists, the job's events, its loss curve, a GRPO job's iterations, the
command summary."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.db.models import BooleanField, Count, ExpressionWrapper, F, Max, Min, Q, QuerySet

from training.charts import (
    RewardChart,
    RewardPoint,
    UpdateChart,
    reward_chart,
    update_chart,
    x_axis,
    y_axis,
)
from training.config import config_is_grpo
from training.jobs import SUBMISSION
from training.models import GrpoIteration, LocalRun, TrainingEvent, TrainingJob
from training.open_models.rewards import DEFAULT_REWARD, parse_reward
from training.providers import provider_kind, provider_names
from training.upload_files import ValidationSource, validation_source

# The job page is refreshed every few seconds by every open tab: it shows a bounded page.
EVENTS_SHOWN = 200
EVENTS_COUNTED = 10_000
CHART_BUCKETS = 1000


def jobs_recent() -> QuerySet[TrainingJob]:
    return TrainingJob.objects.select_related(
        "dataset_version__dataset", "validation_version__dataset", "created_by"
    ).order_by("-created_at", "-id")


@dataclass(frozen=True)
class JobEvents:
    """The newest events of a job, oldest first, and how many older ones are not shown."""

    shown: list[TrainingEvent]
    earlier: int
    earlier_at_least: bool  # `earlier` is a floor: counting stopped there


def job_events(
    *, job: TrainingJob, limit: int = EVENTS_SHOWN, count_up_to: int = EVENTS_COUNTED
) -> JobEvents:
    """The newest `limit` events by time, then source (the provider's before the studio's
    notes of the same instant), oldest first: the timeline reads top to bottom.

    A job may hold a million metric rows: the page is refreshed every few seconds by every
    open tab, so it reads a page of them and counts the rest only up to `count_up_to`.
    """
    studio = ExpressionWrapper(Q(type__startswith="studio."), output_field=BooleanField())
    newest = list(job.events.alias(studio=studio).order_by("-time", "-studio", "-id")[:limit])
    newest.reverse()
    earlier = 0
    if len(newest) == limit:
        counted = job.events.order_by()[: limit + count_up_to].count()
        earlier = counted - limit
    return JobEvents(shown=newest, earlier=earlier, earlier_at_least=earlier >= count_up_to)


def job_validation_source(*, job: TrainingJob) -> ValidationSource | None:
    """Where the job's validation rows come from, as its submission chose them (none for a
    GRPO job: it has no dataset)."""
    if job.dataset_version is None:
        return None
    source = validation_source(
        version=job.dataset_version, validation_version=job.validation_version
    )
    known = job.provider in provider_names()
    uploads = provider_kind(job.provider).uploads_files if known else True
    if (
        uploads
        and source
        and source.is_split
        and job.remote_job_id
        and not job.remote_validation_file_id
    ):
        return None  # created remotely before a version's own split was sent
    return source


@dataclass(frozen=True)
class LocalRunShown:
    """What the job page says of a job trained on our own workers (the `trl` provider)."""

    notice: str
    waiting: bool  # no train worker has taken the run yet
    step: int = 0
    total_steps: int = 0
    checkpoint_step: int = 0


def job_local_run(*, job: TrainingJob) -> LocalRunShown | None:
    """None for a job of a provider reached through a URL; else one read of its run."""
    if job.provider not in provider_names() or provider_kind(job.provider).needs_url:
        return None
    notice = provider_kind(job.provider).notice
    run = LocalRun.objects.filter(job_id=job.id).first()
    if run is None:
        return LocalRunShown(notice=notice, waiting=job.is_active)
    return LocalRunShown(
        notice=notice,
        waiting=run.status == LocalRun.Status.PENDING and not run.cancel_requested,
        step=run.step,
        total_steps=run.total_steps,
        checkpoint_step=run.checkpoint_step,
    )


def job_unsent(*, job_id: int) -> bool:
    """Whether the job waits for the broker: saved, its task not yet sent."""
    return SUBMISSION.unsent(id=job_id) > 0


def job_summary(job: TrainingJob) -> dict[str, Any]:
    """The last line of `submit_training` and `training_status` (docs/training.md)."""
    return {
        "job_id": job.id,
        "status": job.status,
        "provider": job.provider,
        "remote_job_id": job.remote_job_id or None,
        "fine_tuned_model": job.fine_tuned_model or None,
        "events": job.events.count(),
    }


@dataclass(frozen=True)
class LossBucket:
    """The points of one loss series whose steps fall in [first, stop): extremes and count."""

    first: int
    stop: int
    low: float
    high: float
    count: int


@dataclass(frozen=True)
class LossSeries:
    """A loss series cut into at most CHART_BUCKETS step ranges, each with its min and max."""

    train: list[LossBucket]
    validation: list[LossBucket]

    @property
    def train_count(self) -> int:
        return sum(bucket.count for bucket in self.train)

    @property
    def validation_count(self) -> int:
        return sum(bucket.count for bucket in self.validation)


# One pass over the job's loss rows in step order (the partial index `training_event_loss`
# holds exactly them, with the losses, so it is read without the table), in at most
# CHART_BUCKETS step ranges of equal width; each range keeps its min and max, so a spike
# survives however many points share its pixel. A job with fewer steps than buckets gets
# one range per step: nothing is dropped.
_LOSS_BUCKETS_SQL = """
WITH bounds AS (
    SELECT min(step) AS lo, max(step)::bigint - min(step) + 1 AS span
    FROM {table}
    WHERE job_id = %(job)s AND {has_loss}
), ranges AS (
    SELECT lo + (k * span + n - 1) / n AS first, lo + ((k + 1) * span + n - 1) / n AS stop
    FROM bounds, LATERAL (SELECT LEAST(span, %(buckets)s) AS n) AS sized,
        generate_series(0, sized.n - 1) AS k
    WHERE lo IS NOT NULL
)
SELECT ranges.first, ranges.stop, agg.*
FROM ranges, LATERAL (
    SELECT min(train_loss), max(train_loss), count(train_loss),
        min(validation_loss), max(validation_loss), count(validation_loss)
    FROM {table}
    WHERE job_id = %(job)s AND step >= ranges.first AND step < ranges.stop AND {has_loss}
) AS agg
ORDER BY ranges.first
"""
# The index's condition, word for word, so the planner sees the query is within it.
_HAS_LOSS = "(step IS NOT NULL AND (train_loss IS NOT NULL OR validation_loss IS NOT NULL))"


def job_loss_series(*, job: TrainingJob, buckets: int = CHART_BUCKETS) -> LossSeries:
    """The job's train and validation loss, downsampled in the database to <= `buckets`
    ranges per series (so at most 2 x `buckets` points are drawn at any size)."""
    if connection.vendor == "postgresql":
        rows = _loss_buckets_postgresql(job, buckets)
    else:  # the SQLite demo: no LATERAL, no generate_series
        rows = _loss_buckets_grouped(job, buckets)
    train: list[LossBucket] = []
    validation: list[LossBucket] = []
    for first, stop, t_lo, t_hi, t_n, v_lo, v_hi, v_n in rows:
        if t_n:
            train.append(LossBucket(first, stop, t_lo, t_hi, t_n))
        if v_n:
            validation.append(LossBucket(first, stop, v_lo, v_hi, v_n))
    return LossSeries(train=train, validation=validation)


def _loss_buckets_postgresql(job: TrainingJob, buckets: int) -> list[tuple]:
    sql = _LOSS_BUCKETS_SQL.format(table=TrainingEvent._meta.db_table, has_loss=_HAS_LOSS)
    with transaction.atomic(), connection.cursor() as cursor:
        # Compiling this short query (a JIT's cost model sees 1,000 sub-plans) takes longer
        # than running it.
        cursor.execute("SET LOCAL jit = off")
        cursor.execute(sql, {"job": job.id, "buckets": buckets})
        return cursor.fetchall()


def _loss_buckets_grouped(job: TrainingJob, buckets: int) -> list[tuple]:
    """The ranges of `_LOSS_BUCKETS_SQL`, each loss row put in its range by arithmetic and
    grouped: range k starts at lo + ceil(k * span / n), so a step's range is
    floor((step - lo) * n / span)."""
    rows = job.events.filter(
        Q(step__isnull=False) & (Q(train_loss__isnull=False) | Q(validation_loss__isnull=False))
    ).order_by()
    bounds = rows.aggregate(lo=Min("step"), hi=Max("step"))
    lo = bounds["lo"]
    if lo is None:
        return []
    span = bounds["hi"] - lo + 1
    n = min(span, buckets)
    ranges = (
        rows.annotate(k=(F("step") - lo) * n / span)
        .values("k")
        .annotate(
            Min("train_loss"),
            Max("train_loss"),
            Count("train_loss"),
            Min("validation_loss"),
            Max("validation_loss"),
            Count("validation_loss"),
        )
        .order_by("k")
        .values_list(
            "k",
            "train_loss__min",
            "train_loss__max",
            "train_loss__count",
            "validation_loss__min",
            "validation_loss__max",
            "validation_loss__count",
        )
    )
    return [
        (lo + (k * span + n - 1) // n, lo + ((k + 1) * span + n - 1) // n, *losses)
        for k, *losses in ranges
    ]


@dataclass(frozen=True)
class LossChart:
    """An inline SVG line chart's geometry: polylines of train and validation loss."""

    width: int
    height: int
    train_points: str
    validation_points: str
    steps: tuple[int, int]
    losses: tuple[float, float]
    train_count: int
    validation_count: int
    # Points drawn per series (each bucket's min and max): at most 2 x CHART_BUCKETS.
    train_drawn: int = 0
    validation_drawn: int = 0

    @property
    def empty(self) -> bool:
        return not (self.train_count or self.validation_count)

    @property
    def downsampled(self) -> bool:
        return (self.train_drawn, self.validation_drawn) != (
            self.train_count,
            self.validation_count,
        )


def job_loss_chart(*, job: TrainingJob, width: int = 640, height: int = 220) -> LossChart:
    series = job_loss_series(job=job)
    buckets = series.train + series.validation
    if not buckets:
        return LossChart(width, height, "", "", (0, 0), (0.0, 0.0), 0, 0)
    lo_s = min(b.first for b in buckets)
    hi_s = max(b.stop - 1 for b in buckets)
    lo_y = min(b.low for b in buckets)
    hi_y = max(b.high for b in buckets)
    x, y = x_axis(lo_s, hi_s, width).at, y_axis(lo_y, hi_y, height).at

    def points(part: list[LossBucket]) -> list[str]:
        drawn: list[str] = []
        previous: float | None = None
        for bucket in part:
            # A range is one step or narrower than a pixel: its min and max are drawn at its
            # middle, entered from the end nearer the line so far (no zigzag across it).
            px = x((bucket.first + bucket.stop - 1) / 2)
            ends = [y(bucket.low), y(bucket.high)]
            if previous is not None and abs(ends[1] - previous) < abs(ends[0] - previous):
                ends.reverse()
            if ends[0] == ends[1]:
                ends = ends[:1]
            drawn += [f"{px:.1f},{py:.1f}" for py in ends]
            previous = ends[-1]
        return drawn

    train, validation = points(series.train), points(series.validation)
    return LossChart(
        width=width,
        height=height,
        train_points=" ".join(train),
        validation_points=" ".join(validation),
        steps=(lo_s, hi_s),
        losses=(lo_y, hi_y),
        train_count=series.train_count,
        validation_count=series.validation_count,
        train_drawn=len(train),
        validation_drawn=len(validation),
    )


# -- a GRPO job ([training] mode = "grpo") -----------------------------------------------------

# The iterations a GRPO job's page shows and draws: the newest, however long the run.
GRPO_ITERATIONS_SHOWN = 500
# An iteration's achievements shown beside it: its most often unlocked.
GRPO_TOP_RATES = 3


@dataclass(frozen=True)
class GrpoRow:
    """One iteration as the job page shows it; `top_rates`: (achievement, percent)."""

    iteration: GrpoIteration
    top_rates: list[tuple[str, float]]


@dataclass(frozen=True)
class GrpoShown:
    """What the job page says of a GRPO job: its settings, its iterations and their charts."""

    reward: str  # as the TOML wrote it
    reward_words: str
    group_size: Any
    seeds_per_iteration: Any
    steps_per_episode: Any
    iterations_total: Any
    iterations_done: int
    rows: list[GrpoRow]
    earlier: int  # iterations before the shown ones
    reward_chart: RewardChart
    update_chart: UpdateChart


def reward_words(text: str) -> str:
    """A `[training.grpo] reward` in words (rewards.py's kinds), or why it is not one."""
    try:
        spec = parse_reward(text)
    except ValueError as exc:
        return f"not a reward the trainer knows: {exc}"
    names = ", ".join(spec.names)
    return {
        "crafter": "Crafter's own reward summed over the episode: +1 for each achievement's "
        "first unlock, plus or minus 0.1 for each point of health gained or lost.",
        "score": "The episode's Crafter score alone (each achievement unlocked or not), in "
        "percent.",
        "achievements": f"How many of these achievements the episode unlocked: {names}.",
        "action": f"The share of the episode's executed actions that were {names}.",
    }[spec.kind]


def _top_rates(rates: Any) -> list[tuple[str, float]]:
    """The highest success rates of an iteration, its JSON cleaned: names as text cut short,
    finite numbers only (the row is written by a worker, from a game)."""
    if not isinstance(rates, dict):
        return []
    clean = [
        (str(name)[:60], float(value))
        for name, value in rates.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ]
    clean.sort(key=lambda item: (-item[1], item[0]))
    return [item for item in clean[:GRPO_TOP_RATES] if item[1] > 0]


def job_grpo(*, job: TrainingJob, limit: int = GRPO_ITERATIONS_SHOWN) -> GrpoShown | None:
    """None for a job that is not GRPO's; else its settings and its newest `limit` iterations
    (each with its batch's id), oldest first."""
    config = job.effective_config if isinstance(job.effective_config, dict) else {}
    if not config_is_grpo(config):
        return None
    grpo = config.get("training.grpo")
    grpo = grpo if isinstance(grpo, dict) else {}
    iterations = job.grpo_iterations.order_by("-number")
    newest = list(iterations[:limit])
    newest.reverse()
    total = iterations.count() if len(newest) == limit else len(newest)
    reward = str(grpo.get("reward", DEFAULT_REWARD))
    return GrpoShown(
        reward=reward,
        reward_words=reward_words(reward),
        group_size=grpo.get("group_size"),
        seeds_per_iteration=grpo.get("seeds_per_iteration"),
        steps_per_episode=grpo.get("steps_per_episode"),
        iterations_total=grpo.get("iterations"),
        iterations_done=job.grpo_iterations.filter(status=GrpoIteration.Status.COMPLETE).count(),
        rows=[GrpoRow(it, _top_rates(it.success_rates)) for it in newest],
        earlier=total - len(newest),
        reward_chart=reward_chart(
            [
                RewardPoint(it.number, it.reward_mean, it.reward_low, it.reward_high)
                for it in newest
                if it.reward_mean is not None
            ]
        ),
        update_chart=update_chart([(it.number, it.loss, it.kl) for it in newest]),
    )
