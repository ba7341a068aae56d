"""Celery tasks: thin, take an id, call a service. Safe to deliver twice."""

from __future__ import annotations

from celery import shared_task

from probes import runs
from probes.jobs import PROBE_CHUNK


@shared_task(
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=6 * 3600,
    time_limit=6 * 3600 + 120,
    max_retries=None,
)
def probe_chunk_run(self, chunk_id: int) -> str:
    return PROBE_CHUNK.run_in_task(self, lambda: runs.probe_chunk_run(chunk_id=chunk_id))
