"""Celery tasks: thin, take an id, call a service. Safe to deliver twice.

Named as when the package was `datasets`: messages already queued and the beat schedule
find them by these names.
"""

from __future__ import annotations

from celery import shared_task

from curation import services, services_import
from curation.jobs import EXPORT, IMPORT


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
    return EXPORT.run_in_task(self, lambda: services.dataset_version_export(version_id=version_id))


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
    return IMPORT.run_in_task(self, lambda: services_import.dataset_import_run(job_id=import_id))


@shared_task(name="datasets.tasks.datasets_requeue_waiting", acks_late=True, time_limit=300)
def datasets_requeue_waiting() -> int:
    # Beat's old entry, kept for messages queued under its name: `studio.tasks.jobs_requeue`.
    return len(EXPORT.requeue()) + len(IMPORT.requeue())
