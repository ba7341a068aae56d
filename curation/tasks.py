"""Celery tasks: thin, take an id, call a service. Safe to deliver twice.

Named as when the package was `datasets`: messages already queued and the beat schedule
find them by these names.
"""

from __future__ import annotations

from celery import shared_task

from curation import services, services_import
from curation.jobs import EXPORT, IMPORT
from studio.jobs import is_outage, retry_after_outage


@shared_task(
    name="datasets.tasks.dataset_version_export",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=4 * 3600,
    time_limit=4 * 3600 + 120,
    max_retries=None,
)
def dataset_version_export(self, version_id: int) -> str:
    try:
        outcome = services.dataset_version_export(version_id=version_id)
    except Exception as exc:
        if not is_outage(exc):
            raise
        # The database or the broker is down: export again once it is back.
        raise retry_after_outage(self, exc) from exc
    if outcome == "busy":
        # Another worker holds a fresh claim; look again once it would count as stale.
        raise self.retry(countdown=int(EXPORT.stale_after().total_seconds()))
    return outcome


@shared_task(
    name="datasets.tasks.dataset_import_run",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=2 * 3600,
    time_limit=2 * 3600 + 120,
    max_retries=None,
)
def dataset_import_run(self, import_id: int) -> str:
    try:
        outcome = services_import.dataset_import_run(job_id=import_id)
    except Exception as exc:
        if not is_outage(exc):
            raise
        # The database or the broker is down: go on once it is back.
        raise retry_after_outage(self, exc) from exc
    if outcome == "busy":
        # Another worker holds a fresh claim; look again once it would count as stale.
        raise self.retry(countdown=int(IMPORT.stale_after().total_seconds()))
    return outcome


@shared_task(name="datasets.tasks.datasets_requeue_waiting", acks_late=True, time_limit=300)
def datasets_requeue_waiting() -> int:
    # Beat's old entry, kept for messages queued under its name: `studio.tasks.jobs_requeue`.
    return len(EXPORT.requeue()) + len(IMPORT.requeue())
