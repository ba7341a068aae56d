"""Celery tasks: thin, call a read. Safe to deliver twice."""

from __future__ import annotations

from celery import shared_task

from evaluation import selectors


@shared_task(acks_late=True, time_limit=600)
def statistics_warm() -> int:
    """Fill the shared cache with the leaderboard's statistics, so that its first viewer after
    a batch finishes does not pay for them. Sent by name by `rollouts.recording.services`
    (rollouts does not import evaluation). Comparisons are per pair of batches: computed when
    first asked. Returns the number of rows (a cached leaderboard costs two queries)."""
    return len(selectors.leaderboard_rows())
