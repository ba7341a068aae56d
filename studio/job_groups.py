"""A parent whose work is done by claimed children: a batch's episodes, a probe run's chunks.

The group says once how such a parent's life goes on top of its children's job kind
(`studio.jobs.JobKind`): its children are sent once the parent is committed, run in this
process instead (`run_inline`: `--inline`, tests, benchmarks), resumed (the children that
stopped start again, the parent is open again) and canceled (the open children stop, the
parent ends as canceled, keeping what was done). What differs between a batch and a run (a
batch's counters, a run's chunk sizes) stays with each app, through the hooks each call
takes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from django.db import close_old_connections, transaction
from django.db.models import Model, QuerySet
from django.utils import timezone

from studio.claims import PENDING, RUNNING
from studio.jobs import JobKind

# What a canceled parent's error says, and its open children's (the words users see).
CANCELED_ERROR = "canceled"


@dataclass(frozen=True)
class JobGroup:
    """A parent model and the job kind of its children."""

    parent: type[Model]
    children: JobKind
    # The children's foreign key to their parent ("batch", "run").
    link: str
    # The child status that needs no more work (an episode's "finished", a chunk's "done").
    done: str
    # The child statuses a resume starts again.
    stopped: tuple[str, ...]
    # The status a cancel gives the parent, and the open children.
    parent_canceled: str
    child_canceled: str
    # The parent's statuses while it is open, and the one a resume gives it before it started.
    parent_running: str = RUNNING
    parent_pending: str = PENDING

    def rows(self, parent_id: int) -> QuerySet:
        return self.children.model.objects.filter(**{f"{self.link}_id": parent_id})

    def open_ids(self, parent_id: int, *, ended: Iterable[str] = ()) -> list[int]:
        """The children not done (nor in `ended`), in their order of play."""
        rows = self.rows(parent_id).exclude(status__in=[self.done, *ended])
        return list(rows.order_by("pk").values_list("pk", flat=True))

    def send_on_commit(self, ids: list[int]) -> None:
        """Send the children once the caller's transaction commits (at once outside one)."""
        if ids:
            transaction.on_commit(lambda: self.children.enqueue_many(ids))

    def resume(
        self,
        parent_id: int,
        *,
        enqueue: bool = True,
        child_fields: dict[str, Any] | None = None,
        parent_fields: Callable[[int], dict[str, Any]] | None = None,
    ) -> int:
        """Start again what did not finish: the stopped children are pending again (with
        `child_fields`), the parent open again (with `parent_fields(reset)`), and what is
        left is sent once committed (`enqueue=False`: the caller runs it, and the periodic
        requeue must leave it alone). How many children are left."""
        with transaction.atomic():
            locked = self.parent.objects.select_for_update().get(pk=parent_id)
            reset = (
                self.rows(parent_id)
                .filter(status__in=self.stopped)
                .update(
                    status=PENDING,
                    error="",
                    claim_token="",
                    finished_at=None,
                    **(child_fields or {}),
                )
            )
            left = self.open_ids(parent_id)
            if not enqueue:
                self.rows(parent_id).filter(status=PENDING).update(enqueued_at=timezone.now())
            if left:
                self.parent.objects.filter(pk=parent_id).update(
                    status=self.parent_running if locked.started_at else self.parent_pending,
                    error="",
                    finished_at=None,
                    **(parent_fields(reset) if parent_fields is not None else {}),
                )
                if enqueue:
                    transaction.on_commit(lambda: self.send_again(left))
        return len(left)

    def send_again(self, ids: list[int]) -> int:
        """Send these children again; how many were sent. Those pending count as never sent
        until their new message has left (the periodic requeue sends them if it cannot)."""
        if ids:
            self.children.model.objects.filter(pk__in=ids, status=PENDING).update(enqueued_at=None)
        return self.children.enqueue_many(ids)

    def cancel(
        self,
        parent_id: int,
        *,
        before: Callable[[Model], None] | None = None,
        parent_fields: Callable[[int], dict[str, Any]] | None = None,
    ) -> int:
        """Stop an open parent: its pending and running children end as canceled (a worker
        holding one finds out at its next claim check and stops before its next call), the
        parent as canceled, with what was done kept. `before(locked parent)` runs first,
        under the parent's lock; `parent_fields(stopped)` is written with the parent's end.
        How many children were stopped (0 when the parent was not open)."""
        now = timezone.now()
        with transaction.atomic():
            locked = self.parent.objects.select_for_update().get(pk=parent_id)
            if locked.status not in (self.parent_pending, self.parent_running):
                return 0
            if before is not None:
                before(locked)
            stopped = (
                self.rows(parent_id)
                .filter(status__in=[PENDING, self.children.working])
                .update(status=self.child_canceled, error=CANCELED_ERROR, finished_at=now)
            )
            self.parent.objects.filter(pk=parent_id).update(
                status=self.parent_canceled,
                error=CANCELED_ERROR,
                finished_at=now,
                **(parent_fields(stopped) if parent_fields is not None else {}),
            )
        return stopped


def run_inline(
    ids: list[int],
    work: Callable[[int], Any],
    *,
    workers: int,
    advanced: Callable[[], None] = lambda: None,
) -> None:
    """`work(id)` for each child in this process: up to `workers` at once, each in a thread
    with its own database connection; one by one when `workers` is 1 or inside an open
    transaction (other connections cannot see into it: they would find nothing to do).
    `advanced()` is called after each."""
    if transaction.get_connection().in_atomic_block:
        workers = 1
    if min(workers, len(ids)) <= 1:
        for pk in ids:
            work(pk)
            advanced()
        return

    def in_thread(pk: int) -> Any:
        try:
            return work(pk)
        finally:
            close_old_connections()  # this thread's own connection

    with ThreadPoolExecutor(max_workers=min(workers, len(ids))) as pool:
        for _ in pool.map(in_thread, ids):
            advanced()
