"""Reads for training jobs: lists, the job's events, its loss curve, the command summary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet

from training.models import TrainingEvent, TrainingJob
from training.upload_files import ValidationSource, validation_source


def jobs_recent() -> QuerySet[TrainingJob]:
    return TrainingJob.objects.select_related(
        "dataset_version__dataset", "validation_version__dataset", "created_by"
    ).order_by("-created_at", "-id")


def job_events(*, job: TrainingJob, limit: int = 500) -> list[TrainingEvent]:
    """The newest `limit` events, oldest first (the timeline reads top to bottom)."""
    newest = list(job.events.order_by("-time", "-id")[:limit])
    newest.reverse()
    return newest


def job_validation_source(*, job: TrainingJob) -> ValidationSource | None:
    """Where the job's validation rows come from, as its submission chose them."""
    source = validation_source(
        version=job.dataset_version, validation_version=job.validation_version
    )
    if source and source.is_split and job.remote_job_id and not job.remote_validation_file_id:
        return None  # created remotely before a version's own split was sent
    return source


def job_unsent(*, job_id: int) -> bool:
    """Whether the job waits for the broker: saved, its task not yet sent."""
    return TrainingJob.objects.filter(
        id=job_id, status=TrainingJob.Status.PENDING, enqueued_at__isnull=True
    ).exists()


def job_summary(job: TrainingJob) -> dict[str, Any]:
    """The last line of `submit_training` and `training_status` (SPEC section 4)."""
    return {
        "job_id": job.id,
        "status": job.status,
        "provider": job.provider,
        "remote_job_id": job.remote_job_id or None,
        "fine_tuned_model": job.fine_tuned_model or None,
        "events": job.events.count(),
    }


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

    @property
    def empty(self) -> bool:
        return not (self.train_count or self.validation_count)


def job_loss_chart(*, job: TrainingJob, width: int = 640, height: int = 220) -> LossChart:
    rows = list(
        job.events.exclude(step=None)
        .exclude(train_loss=None, validation_loss=None)
        .values_list("step", "train_loss", "validation_loss")
    )
    train = sorted({(s, t) for s, t, _ in rows if t is not None})
    val = sorted({(s, v) for s, _, v in rows if v is not None})
    values = [y for _, y in train] + [y for _, y in val]
    steps = [s for s, _ in train] + [s for s, _ in val]
    if not values:
        return LossChart(width, height, "", "", (0, 0), (0.0, 0.0), 0, 0)
    lo_s, hi_s = min(steps), max(steps)
    lo_y, hi_y = min(values), max(values)
    pad = 24

    def point(step: int, y: float) -> str:
        px = pad + (width - 2 * pad) * ((step - lo_s) / (hi_s - lo_s) if hi_s > lo_s else 0.5)
        py = pad + (height - 2 * pad) * ((hi_y - y) / (hi_y - lo_y) if hi_y > lo_y else 0.5)
        return f"{px:.1f},{py:.1f}"

    return LossChart(
        width=width,
        height=height,
        train_points=" ".join(point(s, y) for s, y in train),
        validation_points=" ".join(point(s, y) for s, y in val),
        steps=(lo_s, hi_s),
        losses=(lo_y, hi_y),
        train_count=len(train),
        validation_count=len(val),
    )
