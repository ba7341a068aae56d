"""The background jobs of datasets, each declared once (`studio.jobs`): a version's export
and an uploaded file's import. Task names are the app label's (`datasets.tasks...`): messages
already queued find them by these names."""

from __future__ import annotations

from curation.models import DatasetImport, DatasetVersion
from studio.jobs import JobKind, register

EXPORT = register(
    JobKind(
        name="export",
        model=DatasetVersion,
        task="datasets.tasks.dataset_version_export",
        stale_setting="STUDIO_EXPORT_STALE_SECONDS",
        hours=4,
    )
)

IMPORT = register(
    JobKind(
        name="import",
        model=DatasetImport,
        task="datasets.tasks.dataset_import_run",
        stale_setting="STUDIO_IMPORT_STALE_SECONDS",
        hours=2,
    )
)
