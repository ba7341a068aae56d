"""The background job of probe runs, declared once (`studio.jobs`): a chunk of a run's
questions, asked by one task that claims it."""

from __future__ import annotations

from django.db.models import QuerySet

from probes.models import ProbeRun, ProbeRunChunk
from studio.jobs import JobKind, register


def _of_open_runs() -> QuerySet:
    # A failed run stopped (its endpoint was unusable): its chunks wait for a resume.
    return ProbeRunChunk.objects.exclude(run__status=ProbeRun.Status.FAILED)


# A chunk holds model calls as an episode does, and its worker renews its claim the same
# way (`probes.claim_keeper`, every third of the window, however long a call takes), so it
# is presumed dead after the same silence.
PROBE_CHUNK = register(
    JobKind(
        name="probe_chunk",
        model=ProbeRunChunk,
        task="probes.tasks.probe_chunk_run",
        stale_setting="STUDIO_EPISODE_STALE_SECONDS",
        rows=_of_open_runs,
    )
)
