"""What a train worker's trainer reports, written as its run's rows: bounded, cleaned
`LocalRunEvent`s (events, and a metric point per step and name), through the run's claim,
which each step renews. The provider's poll reads them (`training.local_runs`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.utils import timezone

from studio.claims import Claim
from training import model_store
from training.models import LocalRun, LocalRunEvent
from training.providers.base import clean_data, clean_number, clean_step, clean_text

# The events one run keeps at most (metric points are one per step and name); past it only
# errors are kept, so a trainer that logs without end cannot fill the table.
MAX_RUN_EVENTS = 2000
_LEVELS = ("info", "warning", "error")


class RunSink:
    """What the trainer reports, written as the run's rows (`training.open_models.runner
    .RunSink`): cleaned, bounded, through the run's claim."""

    def __init__(self, run: LocalRun, claim: Claim) -> None:
        self.run_id = run.id
        self.job_id = run.job_id
        self.claim = claim
        self.lost = False
        self._events = LocalRunEvent.objects.filter(
            run_id=run.id, kind=LocalRunEvent.Kind.EVENT
        ).count()

    def event(
        self, type: str, message: str, *, level: str = "info", data: dict | None = None
    ) -> None:
        level = level if level in _LEVELS else "info"
        if self._events >= MAX_RUN_EVENTS and level != "error":
            return
        data = clean_data(data) if isinstance(data, dict) else {}
        LocalRunEvent.objects.create(
            run_id=self.run_id,
            kind=LocalRunEvent.Kind.EVENT,
            time=timezone.now(),
            level=level,
            type=clean_text(type, limit=100),
            message=clean_text(message),
            data=data if isinstance(data, dict) else {},
        )
        self._events += 1
        total = clean_step(data.get("steps")) if type == "started" else None
        if total:
            self._renew(total_steps=total)

    def metrics(
        self, step: int, *, train_loss: float | None = None, validation_loss: float | None = None
    ) -> None:
        step = clean_step(step)
        if step is None:
            return
        now = timezone.now()
        points = [
            LocalRunEvent(
                run_id=self.run_id,
                kind=LocalRunEvent.Kind.METRIC,
                time=now,
                name=name,
                step=step,
                value=value,
            )
            for name, value in (
                ("train", clean_number(train_loss)),
                ("validation", clean_number(validation_loss)),
            )
            if value is not None
        ]
        # A step logged again after a resume keeps its first point: the curve is not doubled.
        LocalRunEvent.objects.bulk_create(points, ignore_conflicts=True)
        self._renew(step=step)

    def should_stop(self) -> bool:
        """Asked after every step: one read by primary key, never throttled."""
        row = (
            LocalRun.objects.filter(pk=self.run_id)
            .values_list("cancel_requested", "claim_token")
            .first()
        )
        if row is None or row[1] != self.claim.token:
            self.lost = True
            return True
        return bool(row[0])

    def checkpoint_saved(self, step: int, directory: Path) -> None:
        model_store.checkpoint_upload(self.job_id, step, Path(directory))
        self._renew(checkpoint_step=step)
        self.event("checkpoint", f"Checkpoint of step {step} stored", data={"step": step})

    def _renew(self, **fields: Any) -> None:
        if not self.claim.renew(**fields):
            self.lost = True
