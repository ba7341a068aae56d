"""Probe runs: create a run of every question of a set in chunks, send them or ask them here,
resume and cancel it (`probes.runs.CHUNKS`, a `studio.job_groups.JobGroup`).

A run is split into chunks of at most `CHUNK_SIZE` questions (fewer when the run's
concurrency would otherwise leave workers idle); each chunk is one Celery task that claims
its row and asks its questions (`probes.chunks`). An unusable endpoint fails the run at once
with one clear error (`probes.chunks.probe_run_fail`); `probe_run_resume` asks what is
left. What results read of a run is in `probes.selectors_runs`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from django.db import transaction
from django.db.models import Count, Max, Min
from django.utils import timezone

from probes.chunks import MAX_CONCURRENCY, probe_chunk_run
from probes.jobs import PROBE_CHUNK
from probes.models import ProbeRun, ProbeRunChunk, ProbeSet
from probes.prompting import LETTERS, OBSERVATIONS
from studio.endpoints import (
    EndpointError,
    endpoint_check_model,
    endpoint_get,
)
from studio.job_groups import JobGroup, run_inline
from studio.models import Endpoint

logger = logging.getLogger(__name__)

CHUNK_SIZE = 64


# A run's chunks, as a group (`studio.job_groups`): sent, resumed and canceled together. A
# canceled chunk is failed (with the error "canceled"): its run says it was canceled.
CHUNKS = JobGroup(
    parent=ProbeRun,
    children=PROBE_CHUNK,
    link="run",
    done=ProbeRunChunk.Status.DONE,
    stopped=(ProbeRunChunk.Status.FAILED,),
    parent_canceled=ProbeRun.Status.CANCELED,
    child_canceled=ProbeRunChunk.Status.FAILED,
)


class RunError(ValueError):
    """A run that cannot be made as asked; the message says why in one line."""


# --- creating and sending ----------------------------------------------------------------


def probe_run_create(
    *,
    probe_set: ProbeSet,
    endpoint_name: str,
    model: str,
    observation: str = ProbeRun.Observation.IMAGE,
    concurrency: int | None = None,
    created_by=None,
    enqueue: bool = True,
) -> ProbeRun:
    """A pending run of every question of the set, its chunks sent to workers once committed
    (`enqueue=False`: the caller asks them, `probe_run_inline`). `endpoint_name` is an
    admin-named chat endpoint; its allowed models apply, and its key goes to its URL only."""
    model = model.strip()
    if not model or len(model) > 200:
        raise RunError("model: give a model name of 1 to 200 characters")
    try:
        endpoint = endpoint_get(name=endpoint_name, kind=Endpoint.Kind.CHAT)
        endpoint_check_model(endpoint=endpoint, model=model)
    except EndpointError as exc:
        raise RunError(str(exc)) from exc
    if observation not in OBSERVATIONS:
        raise RunError(f"observation: {observation!r} is not one of {', '.join(OBSERVATIONS)}")
    concurrency = endpoint.concurrency if concurrency is None else int(concurrency)
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise RunError(f"concurrency: {concurrency} is not between 1 and {MAX_CONCURRENCY}")
    span = probe_set.questions.aggregate(total=Count("id"), first=Min("index"), last=Max("index"))
    total = span["total"]
    if not total:
        raise RunError(f"probe set {probe_set.id} has no questions")
    widest = max(len(c) for c in probe_set.questions.values_list("choices", flat=True))
    if widest > len(LETTERS):
        raise RunError(f"probe set {probe_set.id}: a question has more than 26 choices")
    first, last = span["first"], span["last"] + 1
    size = chunk_size(total=last - first, concurrency=concurrency)
    with transaction.atomic():
        run = ProbeRun.objects.create(
            probe_set=probe_set,
            endpoint_name=endpoint.name,
            base_url=endpoint.base_url,
            model=model,
            observation=observation,
            concurrency=concurrency,
            questions_total=total,
            created_by=created_by,
        )
        # Without enqueue the caller asks them: stamped as handed over, so the periodic
        # requeue never sends them to workers behind its back.
        handed = None if enqueue else timezone.now()
        chunks = ProbeRunChunk.objects.bulk_create(
            ProbeRunChunk(
                run=run,
                index=i,
                first=start,
                last=min(start + size, last),
                enqueued_at=handed,
                created_by=created_by,
            )
            for i, start in enumerate(range(first, last, size))
        )
        if enqueue:
            CHUNKS.send_on_commit([chunk.id for chunk in chunks])
    return run


def chunk_size(*, total: int, concurrency: int) -> int:
    """At most `CHUNK_SIZE`, and small enough that `concurrency` chunks can run at once."""
    return max(1, min(CHUNK_SIZE, math.ceil(total / max(1, concurrency))))


def probe_run_inline(
    *, run: ProbeRun, progress: Callable[[int], None] | None = None, workers: int | None = None
) -> ProbeRun:
    """Ask the run's open chunks in this process (`probe_run --inline`, tests, benchmarks):
    up to the run's concurrency at once, each in a thread with its own database connection
    (one by one inside an open transaction, which other connections cannot see into).
    `progress(answered)` is called after each chunk. Returns the run as it ended."""
    ids = list(
        run.chunks.filter(status__in=[ProbeRunChunk.Status.PENDING, ProbeRunChunk.Status.RUNNING])
        .order_by("index")
        .values_list("id", flat=True)
    )
    workers = run.concurrency if workers is None else workers

    def advanced() -> None:
        if progress is not None:
            progress(ProbeRun.objects.values_list("answered", flat=True).get(id=run.id))

    run_inline(
        ids, lambda chunk_id: probe_chunk_run(chunk_id=chunk_id), workers=workers, advanced=advanced
    )
    run.refresh_from_db()
    return run


def probe_run_resume(*, run: ProbeRun, enqueue: bool = True) -> int:
    """Ask again what a failed or canceled run left: its stopped chunks start again (skipping
    what they answered), pending ones are sent again. Returns how many chunks are left."""
    left = CHUNKS.resume(run.id, enqueue=enqueue)
    run.refresh_from_db()
    return left


def probe_run_cancel(*, run: ProbeRun) -> int:
    """Stop a pending or running run (`probe_run --cancel`): it ends as canceled, keeping
    what it answered; no question of it is asked after a second (each chunk looks at its
    claim before each call, at most once a second). `probe_run_resume` asks the rest.
    Returns how many chunks were stopped."""
    stopped = CHUNKS.cancel(run.id)
    run.refresh_from_db()
    return stopped
