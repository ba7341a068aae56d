"""Celery tasks: thin, call a read. Safe to deliver twice."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from evaluation import selectors
from studio import queue


@shared_task(acks_late=True, time_limit=600)
def statistics_warm() -> int:
    """Fill the shared cache with the leaderboard's statistics, so that its first viewer after
    a batch finishes does not pay for them. Comparisons are per pair of batches: computed when
    first asked. Returns the number of rows (a cached leaderboard costs two queries)."""
    return len(selectors.leaderboard_rows())


def warm_after_a_batch(sender: Any, batch_id: int, **kwargs: Any) -> None:
    """Connected to `rollouts.recording.services.batch_closed` (`EvaluationConfig.ready`):
    a worker warms the statistics once a batch has closed. A send that fails is only logged
    (`studio.queue.send`): the first viewer computes them instead."""
    queue.send(statistics_warm)
