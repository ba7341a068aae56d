"""Celery tasks: thin, take an id, call a service. Safe to deliver twice.

Named as when the package was `datasets` (`curation.jobs`): messages already queued find them
by these names.
"""

from __future__ import annotations

from curation import services, services_import
from curation.jobs import EXPORT, IMPORT
from studio.jobs import JobOutcome, job_task


@job_task(EXPORT)
def dataset_version_export(version_id: int) -> JobOutcome:
    return services.dataset_version_export(version_id=version_id)


@job_task(IMPORT)
def dataset_import_run(import_id: int) -> JobOutcome:
    return services_import.dataset_import_run(job_id=import_id)
