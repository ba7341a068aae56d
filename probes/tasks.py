"""Celery tasks: thin, take an id, call a service. Safe to deliver twice."""

from __future__ import annotations

from probes import chunks
from probes.jobs import PROBE_CHUNK
from studio.jobs import JobOutcome, job_task


@job_task(PROBE_CHUNK)
def probe_chunk_run(chunk_id: int) -> JobOutcome:
    return chunks.probe_chunk_run(chunk_id=chunk_id)
