"""A dead broker never leaves a dataset version or an import pending forever."""

from __future__ import annotations

from datetime import timedelta

from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils import timezone

from curation import services
from curation.export_options import ExportOptions
from curation.jobs import EXPORT
from curation.models import Dataset, DatasetImport, DatasetVersion
from curation.tasks import dataset_version_export
from curation.tests.conftest import record
from curation.tests.test_import_hostile import good_row
from rollouts.review.turn_selection import TurnSelection
from studio.tasks import jobs_requeue
from studio.testing import JOB_ENDS, queue_drained, wait_for_row


def _dataset() -> Dataset:
    batch = record(seeds=(1, 2), steps=8)
    return services.dataset_create(
        name="d", filters=TurnSelection(batches=(batch.id,)), options=ExportOptions()
    )


def test_it_saves_an_export_says_so_and_runs_it_when_the_broker_is_back(
    broker_switch, editor_client, settings
):
    settings.STUDIO_REQUEUE_GRACE_SECONDS = 0
    dataset = _dataset()
    broker_switch.down()
    response = editor_client.post(
        reverse("datasets:version_create", args=[dataset.id]), follow=True
    )
    assert response.status_code == 200
    assert (
        "Version 1 saved, but the task queue is unreachable; the export will start when it "
        "is back." in response.content.decode()
    )
    version = DatasetVersion.objects.get()
    assert (version.status, version.enqueued_at) == ("pending", None)
    # An upload while the broker is down waits the same way.
    upload = SimpleUploadedFile("rows.jsonl", (good_row() + "\n").encode())
    page = editor_client.post(reverse("datasets:dataset_import"), {"file": upload}, follow=True)
    assert "the import will start when it is back" in page.content.decode()
    job = DatasetImport.objects.get()
    assert (job.status, job.enqueued_at) == ("pending", None)
    assert b"the task queue was unreachable" in page.content

    broker_switch.up()
    jobs_requeue.delay()  # what beat sends every minute
    version = wait_for_row(DatasetVersion, version.id, statuses=JOB_ENDS)
    job = wait_for_row(DatasetImport, job.id, statuses=JOB_ENDS)
    assert version.status == "done" and version.rows == 16
    assert job.status == "done" and job.summary["turns"] == 1
    # The original messages arriving late export and import nothing twice.
    dataset_version_export.delay(version.id)
    jobs_requeue.delay()
    queue_drained()
    assert DatasetVersion.objects.get().sha256 == version.sha256
    assert DatasetImport.objects.get().summary == job.summary
    assert Dataset.objects.filter(name="rows.jsonl").count() == 1


def test_it_takes_over_a_version_whose_worker_died(broker_switch, settings):
    dataset = _dataset()
    version = services.dataset_version_create(dataset=dataset, enqueue=False)
    # As a worker killed mid-export leaves it: running, its heartbeat long silent.
    DatasetVersion.objects.filter(id=version.id).update(
        status="running",
        claim_token="dead",
        heartbeat_at=timezone.now() - EXPORT.stale_after() - timedelta(seconds=5),
        enqueued_at=timezone.now(),
    )
    jobs_requeue.delay()
    version = wait_for_row(DatasetVersion, version.id, statuses=JOB_ENDS)
    assert version.status == "done" and version.rows == 16 and version.claim_token != "dead"
