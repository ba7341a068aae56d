"""Background job kinds: each declared once, with what every kind gets from here.

A kind names its row's model, the Celery task that works on a row (by name: a service that
sends work never imports the task module that calls it back), the setting that says how long
a silent worker is presumed alive, and the status its worker holds a row in. From that it
offers the whole life of a job on top of `studio.claims` and `studio.queue`: `enqueue` (False
while the broker is down; the periodic requeue sends it later), `requeue`, `claim`, `renew`,
`finish` and `fail`, so the policy (one `ClaimLost`, one error cap, one outcome type, one beat
entry) is stated here once and each app only says what its jobs do.

Apps declare their kinds in their own `jobs.py` and `register` them when their `ready()`
imports it; studio imports no app, it walks what was registered (`job_kinds`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from celery import shared_task
from django.conf import settings
from django.db import connections, router, transaction
from django.db.models import Model, Q, QuerySet
from django.utils import timezone

from studio import claim_keeper, claims, queue
from studio.claims import DONE, PENDING, RUNNING, ClaimLost
from studio.outages import (
    OUTAGES,
    is_outage,
    outage_countdown,
    outage_said_in_one_line,
    retry_after_outage,
)
from studio.untrusted import storable

logger = logging.getLogger(__name__)

__all__ = [
    "ERROR_CAP",
    "OUTAGES",
    "ClaimLost",
    "JobKind",
    "JobOutcome",
    "error_cut",
    "is_outage",
    "job_kinds",
    "job_task",
    "jobs_requeue",
    "most_at_once",
    "outage_countdown",
    "outage_said_in_one_line",
    "register",
    "retry_after_outage",
    "take_over_all",
]

# What a job's task reports; a task retries on "busy" (another worker holds a fresh claim)
# and on "retry" (an outside service was down).
JobOutcome = Literal[
    "done",  # the job's work is complete
    "finished",  # an episode played to its end
    "submitted",  # a training job now exists at its provider
    "failed",  # set aside with its error, never retried
    "canceled",
    "busy",
    "retry",
    "done_already",  # ended, gone, or not to be taken: the message was a duplicate
    "claim_lost",  # another worker took the job over from this one
]

# The longest error a job row keeps, in characters (the longest any kind kept before all
# shared one).
ERROR_CAP = 20_000


def error_cut(error: str) -> str:
    """An error as a job row stores it: at most `ERROR_CAP` characters, and storable (an
    exception's text can hold a NUL, which PostgreSQL refuses)."""
    return storable(error[:ERROR_CAP], max_bytes=4 * ERROR_CAP)


@dataclass(frozen=True)
class JobKind:
    """One kind of background job: its rows, its task, its stale window and its statuses."""

    name: str
    model: type[Model]
    # The Celery task that works on one row, by name; it takes the row's id.
    task: str
    # The setting (seconds) after which a worker that has not written is presumed dead.
    stale_setting: str
    # The status a row is held in while a worker works on it.
    working: str = RUNNING
    # The status `finish` ends it with.
    finished: str = DONE
    # Whether the claim dates `started_at`, and `finish` dates `finished_at`: not for a row
    # whose life goes on past its worker's part (a training job runs at its provider).
    stamp_start: bool = True
    stamp_finish: bool = True
    # Which rows may be claimed beyond their status (a training job: no cancel asked for);
    # the requeue leaves the others alone.
    claimable: Q | None = None
    # The rows the requeue looks at, and among them those it sends when waiting for a
    # message (an episode: not a person's game, nor one of a failed batch); all by default.
    rows: Callable[[], QuerySet] | None = None
    waiting_rows: Callable[[], QuerySet] | None = None
    # What dates a row that never had a message (an episode has its batch's date).
    created_field: str = "created_at"
    # Whether a row's work waits on a model's answers (True: every row's; a callable: the
    # rows whose work does). Their tasks go to the model queue (`STUDIO_MODEL_QUEUE`), which
    # a worker with a pool of threads consumes: on a process per core they would wait their
    # turn two at a time on a 2-core host, though each spends its time waiting on the network.
    calls_model: bool | Callable[[], QuerySet] = False
    # How long the row's task may run, in hours (its soft time limit; the hard one is two
    # minutes more, for the work to write what it has).
    hours: float = 1.0
    # The countdowns (seconds) of the tries after an outside service refused the work (a
    # provider's 429 or 5xx: the work says "retry"), one per try: after the last, the work is
    # told it has its last try (`last_attempt`) and fails rather than retries. Empty: a
    # "retry" is an outage of our own, retried without a cap. They stay far below the
    # broker's visibility timeout (2 h): a delayed message is never delivered twice for it.
    retry_countdowns: tuple[int, ...] = ()
    # What a worker's takeover of its predecessor's rows writes on them, besides making them
    # stale (`take_over_all`: an episode dates when its worker was lost).
    taken_over: Callable[[], dict[str, Any]] | None = None

    def stale_after(self) -> timedelta:
        """Read at each call, so a setting changed (in a test, say) applies at once."""
        return timedelta(seconds=getattr(settings, self.stale_setting))

    # -- sending -------------------------------------------------------------------------

    def enqueue(self, pk: int) -> bool:
        """Send the row's task and date its `enqueued_at`; False when the broker cannot be
        reached (the periodic requeue sends it once it is back)."""
        ((name, _),) = self.queues_of([pk])
        return queue.send_job(self.model, self.task, pk, queue=name)

    def enqueue_on_commit(self, pk: int) -> None:
        """`enqueue` once the caller's transaction commits (at once outside one)."""
        transaction.on_commit(lambda: self.enqueue(pk))

    def enqueue_many(self, ids: list[int]) -> int:
        """Send each id's task, in order, on one connection; how many were sent (the first
        ones, up to where the broker failed: the requeue sends the rest)."""
        return len(self._resend(ids))

    def queues_of(self, ids: list[int]) -> list[tuple[str | None, list[int]]]:
        """The ids by the queue their task goes to (None: the task's own route), each group
        in the order given: model work to `STUDIO_MODEL_QUEUE` (`calls_model`)."""
        if not ids or not self.calls_model:
            return [(None, ids)]
        if self.calls_model is True:
            return [(settings.STUDIO_MODEL_QUEUE, ids)]
        calling: set[int] = set()
        for start in range(0, len(ids), 5000):
            part = ids[start : start + 5000]
            calling.update(self.calls_model().filter(pk__in=part).values_list("pk", flat=True))
        groups = [
            (settings.STUDIO_MODEL_QUEUE, [pk for pk in ids if pk in calling]),
            (None, [pk for pk in ids if pk not in calling]),
        ]
        return [(name, group) for name, group in groups if group]

    def _resend(self, ids: list[int]) -> list[int]:
        """Send each id's task on its queue; the ids sent (in each queue, the first ones, up
        to where the broker failed)."""
        sent: list[int] = []
        for name, group in self.queues_of(ids):
            sent += group[: queue.resend(self.model, self.task, group, queue=name)]
        return sent

    def send(self, task: str, pk: int, *args: Any) -> bool:
        """Send another task about one row (a cancel, with its claim's token in `args`),
        through the same path as `enqueue`: False, logged, when the broker cannot be
        reached. No `enqueued_at`: that dates the row's own task."""
        return queue.send(task, pk, *args)

    def to_resend(self, *, broker_lost: bool = False) -> list[int]:
        """The rows the periodic requeue sends again: whose worker died (a stale heartbeat),
        then those pending whose message never left or was lost.

        `broker_lost` (`studio.queue.broker_lost_messages`: the broker lost what it held)
        counts every pending row that was sent as lost, at once; otherwise a message is
        presumed lost after `STUDIO_REQUEUE_PENDING_SECONDS`.
        """
        rows = self.rows() if self.rows is not None else self.model.objects.all()
        if self.claimable is not None:
            rows = rows.filter(self.claimable)
        waiting = self.waiting_rows() if self.waiting_rows is not None else None
        if waiting is not None and self.claimable is not None:
            waiting = waiting.filter(self.claimable)
        ids = claims.jobs_to_resend(
            rows=rows,
            stale_after=self.stale_after(),
            working=self.working,
            waiting_rows=waiting,
            created_field=self.created_field,
        )
        if broker_lost:
            chosen = set(ids)
            sent = (rows if waiting is None else waiting).filter(
                status=PENDING, enqueued_at__isnull=False
            )
            ids += [
                pk
                for pk in sent.order_by("pk").values_list("pk", flat=True).iterator(chunk_size=5000)
                if pk not in chosen
            ]
        return ids

    def unsent(self, **where: Any) -> int:
        """How many of the rows `where` picks are saved but their message never sent (the
        broker was down: the periodic requeue sends them once it is back)."""
        return self.model.objects.filter(claims.UNSENT, **where).count()

    def requeue(self, *, broker_lost: bool = False) -> list[int]:
        """Send again what `to_resend` picks; the ids sent (up to where the broker failed)."""
        return self._resend(self.to_resend(broker_lost=broker_lost))

    # -- a task's body ---------------------------------------------------------------------

    def run_in_task(self, task: Any, work: Callable[..., JobOutcome]) -> JobOutcome:
        """What a bound job task does with its service's `work()`: its outcome; after an
        outage (a lost connection raised, or a "retry" from a kind without
        `retry_countdowns`) the message goes back to the broker soon (`retry_after_outage`);
        while another worker holds a fresh claim ("busy"), it comes back once that claim
        would count as stale.

        A kind with `retry_countdowns` has its work called with `last_attempt`, and its
        "retry" sent back after the next countdown. The tries an outage of our own took are
        counted apart (the message's `outages`), against none of those."""
        outages = int(task.request.kwargs.get("outages", 0)) if task.request.kwargs else 0
        tries = task.request.retries - outages
        countdowns = self.retry_countdowns
        try:
            outcome = work(last_attempt=tries >= len(countdowns)) if countdowns else work()
        except Exception as exc:
            if not is_outage(exc):
                raise
            # The database or the broker is down: go on from where the row says once back.
            raise retry_after_outage(task, exc, **self._counted(outages + 1)) from exc
        if outcome == "retry" and countdowns:
            raise task.retry(
                countdown=countdowns[min(tries, len(countdowns) - 1)],
                max_retries=len(countdowns) + outages,
                **self._counted(outages),
            )
        if outcome == "retry":
            raise retry_after_outage(task)
        if outcome == "busy":
            raise task.retry(countdown=int(self.stale_after().total_seconds()))
        return outcome

    def _counted(self, outages: int) -> dict[str, Any]:
        # Only a kind that caps its retries carries the count of outages in its message.
        return {"kwargs": {"outages": outages}} if self.retry_countdowns else {}

    # -- a worker's claim ----------------------------------------------------------------

    def claim(self, pk: int, /, **fields: Any) -> str | None:
        """Take the row if it is pending, or held with a stale heartbeat (its worker died);
        write `fields` (the job's own resets) with it. The claim's token, or None: see
        `unclaimed` for why."""
        return claims.job_claim(
            model=self.model,
            pk=pk,
            stale_after=self.stale_after(),
            working=self.working,
            where=self.claimable,
            stamp_start=self.stamp_start,
            **fields,
        )

    def claim_returning(
        self, pk: int, /, *, related: str, increment: tuple[str, ...] = (), **fields: Any
    ) -> tuple[str, Model] | None:
        """`claim`, and the row as it is once claimed with its foreign key `related` read
        with it (one statement on PostgreSQL: `studio.claims.job_claim_returning`), for a
        job whose every run starts by reading both (an episode and its batch). `increment`
        names the columns the claim adds one to."""
        return claims.job_claim_returning(
            model=self.model,
            pk=pk,
            stale_after=self.stale_after(),
            related=related,
            working=self.working,
            increment=increment,
            **fields,
        )

    def held(self, pk: int, token: str, /) -> claims.Claim:
        """The handle of a claim this worker holds (`Claim`)."""
        return claims.Claim(self, pk, token)

    def unclaimed(self, pk: int) -> JobOutcome:
        """Why a claim failed: "busy" while another worker holds the row; else
        "done_already" (ended, gone, or not to be claimed)."""
        status = self.model.objects.filter(pk=pk).values_list("status", flat=True).first()
        return "busy" if status == self.working else "done_already"

    def renew(self, pk: int, token: str, /, *, raise_lost: bool = False, **fields: Any) -> bool:
        """Renew the claim, writing `fields` (progress) with it. False when the claim was
        lost, or `ClaimLost` raised with `raise_lost`."""
        held = claims.job_heartbeat(
            model=self.model, pk=pk, token=token, working=self.working, **fields
        )
        if not held and raise_lost:
            raise ClaimLost(f"{self.name} {pk} was claimed by another worker")
        return held

    @contextlib.contextmanager
    def kept(self, pk: int, token: str, /) -> Iterator[None]:
        """Have this process's keeper renew the claim (`studio.claim_keeper`) for as long as
        the block runs, whatever the job does meanwhile (a model call that takes minutes, an
        export's zipping). So the stale window says only how long a dead worker goes
        unnoticed, not how long a job may stay silent."""
        keeper = claim_keeper.keeper_of(self)
        keeper.keep(pk, token)
        try:
            yield
        finally:
            keeper.let_go(pk)

    def finish(self, pk: int, token: str, /, *, status: str = "", **fields: Any) -> bool:
        """End the job as done (the kind's `finished` status, or `status`: an episode that
        failed ends with its batch's counters in the same transaction) with its results in
        `fields`; False: the claim was lost, nothing was written."""
        return claims.job_finish(
            model=self.model,
            pk=pk,
            token=token,
            status=status or self.finished,
            working=self.working,
            stamp_finish=self.stamp_finish,
            **fields,
        )

    def fail(self, pk: int, token: str, /, error: str, **fields: Any) -> bool:
        """End the job as failed with `error` (cut to `ERROR_CAP`): a poison job is set
        aside, never retried. False: the claim was lost.

        Called while an outage is being handled (a service's `except Exception` around the
        job's work caught a lost database or broker connection), it fails nothing: it hands
        the claim back if the database answers again (so the task's next try claims it at
        once) and raises the outage again, for the task to retry (`OUTAGES`). Every kind's
        catch-all goes through here, so this is the one place that tells a poison job from
        a service that was down.
        """
        handled = sys.exc_info()[1]
        if is_outage(handled):
            self.hand_back(pk, token)
            raise handled
        return claims.job_fail(
            model=self.model,
            pk=pk,
            token=token,
            error=error_cut(error),
            working=self.working,
            **fields,
        )

    def release(self, pk: int, token: str, /, **fields: Any) -> bool:
        """Hand the claim back (pending, no token) for a later delivery to take, writing
        `fields`; False: the claim was lost."""
        return claims.job_heartbeat(
            model=self.model,
            pk=pk,
            token=token,
            working=self.working,
            status=PENDING,
            claim_token="",
            **fields,
        )

    def hand_back(self, pk: int, token: str, /) -> None:
        """`release` after an outage, for the task's next try to claim the row at once; while
        the database is still down it writes nothing, and the claim goes stale for a
        takeover instead."""
        connection = connections[router.db_for_write(self.model)]
        with contextlib.suppress(*OUTAGES):
            if not connection.in_atomic_block:
                # A broken connection is not reopened by itself within a task.
                connection.close_if_unusable_or_obsolete()
            self.release(pk, token)


def most_at_once(rows: QuerySet) -> int:
    """How many of these job rows were worked on at the same time, at most: each from its
    last claim (`started_at`) to its end (`finished_at`, or now while it runs). Measured, so
    a page can show what a run got beside the concurrency it asked for: the workers' pools
    may allow fewer (the demo's prefork worker ran model work two at a time)."""
    now = timezone.now()
    changes: list[tuple[Any, int]] = []
    spans = rows.exclude(started_at=None).values_list("started_at", "finished_at")
    for started, finished in spans.iterator(chunk_size=2000):
        changes += [(started, 1), (max(finished or now, started), -1)]
    # At the same instant an end comes before a start: one row handed on to the next is
    # not two at once.
    changes.sort(key=lambda change: (change[0], change[1]))
    at_once = most = 0
    for _, change in changes:
        at_once += change
        most = max(most, at_once)
    return most


_KINDS: dict[str, JobKind] = {}


def register(kind: JobKind) -> JobKind:
    """Make the kind known to the periodic requeue; returns it, to declare and register in
    one statement. Registering the same kind again (a module imported twice) is harmless."""
    known = _KINDS.get(kind.name)
    if known is not None and (known.model, known.task) != (kind.model, kind.task):
        raise ValueError(f"job kind {kind.name!r} is declared twice, differently")
    _KINDS[kind.name] = kind
    return kind


def job_kinds() -> list[JobKind]:
    """Every registered kind, in the order registered (the apps' order)."""
    return list(_KINDS.values())


def take_over_all(name: str) -> dict[str, int]:
    """What a worker of this name held, taken over (`studio.claim_keeper.ClaimKeeper
    .take_over`) for every registered kind whose rows record their worker: how many of
    each. Run when a worker starts (`studio.apps`)."""
    return {
        kind.name: len(claim_keeper.keeper_of(kind).take_over(name))
        for kind in job_kinds()
        if any(field.name == "worker" for field in kind.model._meta.concrete_fields)
    }


def jobs_requeue() -> dict[str, int]:
    """Every kind's `requeue` (what beat runs every STUDIO_REQUEUE_EVERY_SECONDS): how many
    of each were sent.

    When the broker lost its messages (`studio.queue.broker_lost_messages`, asked once for
    all kinds) every pending row that was sent is sent again."""
    broker_lost = queue.broker_lost_messages()
    if broker_lost:
        logger.warning(
            "the broker holds no requeue mark (it lost its messages, or this is its first "
            "requeue): sending every waiting job again"
        )
    return {kind.name: len(kind.requeue(broker_lost=broker_lost)) for kind in job_kinds()}


def job_task(kind: JobKind) -> Callable[[Callable[..., JobOutcome]], Any]:
    """Make `work(pk)` (a service's call for one row) the kind's Celery task: named
    `kind.task`, acknowledged late and given back when its worker is lost (the row's claim
    makes a second delivery harmless), limited to `kind.hours`, retried through
    `JobKind.run_in_task`. Every kind's task is declared through here, so these options are
    stated once.

    A kind with `retry_countdowns` has `work(pk, last_attempt=...)` called."""

    def declare(work: Callable[..., JobOutcome]) -> Any:
        def run(self: Any, pk: int, outages: int = 0) -> JobOutcome:
            # `outages` is read from the message by `run_in_task`.
            return kind.run_in_task(self, functools.partial(work, pk))

        # Not functools.wraps: Celery reads the signature, which must keep `self`.
        run.__name__, run.__qualname__ = work.__name__, work.__qualname__
        run.__module__, run.__doc__ = work.__module__, work.__doc__
        seconds = int(kind.hours * 3600)
        return shared_task(
            name=kind.task,
            bind=True,
            acks_late=True,
            reject_on_worker_lost=True,
            soft_time_limit=seconds,
            time_limit=seconds + 120,
            # Retries are capped by `run_in_task`, per try, not by the task.
            max_retries=None,
        )(run)

    return declare
