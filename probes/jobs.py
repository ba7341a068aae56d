"""The background job of probe runs, declared once (`studio.jobs`): a chunk of a run's
questions, asked by one task that claims it."""

from __future__ import annotations

from django.db.models import QuerySet

from probes.models import ProbeRun, ProbeRunChunk
from studio.jobs import JobKind, register


def _of_open_runs() -> QuerySet:
    # A failed run stopped (its endpoint was unusable), a canceled one was stopped: their
    # chunks wait for a resume.
    return ProbeRunChunk.objects.exclude(
        run__status__in=[ProbeRun.Status.FAILED, ProbeRun.Status.CANCELED]
    )


# A chunk's process renews its claim every third of its window, however long a call takes
# (`studio.claim_keeper`, as episodes' are renewed): the window is only how long a dead
# worker's chunk goes unnoticed.
PROBE_CHUNK = register(
    JobKind(
        name="probe_chunk",
        model=ProbeRunChunk,
        task="probes.tasks.probe_chunk_run",
        stale_setting="STUDIO_PROBE_CHUNK_STALE_SECONDS",
        rows=_of_open_runs,
        calls_model=True,  # every question is a model call
        hours=6,
    )
)
