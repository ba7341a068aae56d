"""Celery tasks: thin, take an id, call a service. Safe to deliver twice."""

from __future__ import annotations

from celery import shared_task

from probes import runs
from probes.jobs import PROBE_CHUNK
from studio.jobs import is_outage, retry_after_outage


@shared_task(
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=6 * 3600,
    time_limit=6 * 3600 + 120,
    max_retries=None,
)
def probe_chunk_run(self, chunk_id: int) -> str:
    try:
        outcome = runs.probe_chunk_run(chunk_id=chunk_id)
    except Exception as exc:
        if not is_outage(exc):
            raise
        # The database or the broker is down: go on from the last stored answer once back.
        raise retry_after_outage(self, exc) from exc
    if outcome == "busy":
        # Another worker holds a fresh claim; look again once it would count as stale.
        raise self.retry(countdown=int(PROBE_CHUNK.stale_after().total_seconds()))
    return outcome
