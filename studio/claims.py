"""Claiming a job's row: the one way a worker takes, renews, ends and re-sends long work.

A job row (`studio.models.ClaimedJob`, or an episode) is worked on only by the worker that
holds its claim: a token written by one conditional UPDATE that succeeds only while the row
is pending, or is being worked on with a heartbeat older than the job's stale window (its
worker died). Every later write goes through the token, so a worker presumed dead that wakes
up finds its writes refused (`False`) and stops; a second message for the same row finds it
claimed or ended and does nothing. Which status means "being worked on" is the job's own
(`working`: "uploading" for a training submission), as is the stale window.
"""

from __future__ import annotations

import contextlib
import functools
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connections, router, transaction
from django.db.models import F, Field, ForeignKey, Model, Q, QuerySet
from django.db.models.expressions import Col
from django.utils import timezone

from studio.outages import waited_out

# A job kind (`studio.jobs.JobKind`, which imports this module): a `Claim` writes through
# its methods.
JobKind = Any

PENDING = "pending"
RUNNING = "running"
DONE = "done"
FAILED = "failed"


# A row saved but its message not sent: the broker was down when it was (the periodic
# requeue sends it once it is back), or its caller runs it itself (`--inline`).
UNSENT = Q(status=PENDING, enqueued_at__isnull=True)


class ClaimLost(Exception):
    """Another worker took the job over (this one was presumed dead): stop, write nothing more."""


def job_claim(
    *,
    model: type[Model],
    pk: int,
    stale_after: timedelta,
    working: str = RUNNING,
    where: Q | None = None,
    stamp_start: bool = True,
    **fields: Any,
) -> str | None:
    """Take the row if it is pending, or `working` with a heartbeat older than `stale_after`.

    Returns the new claim token, or None when another worker holds a fresh claim or the job
    has ended. `where` narrows what may be claimed (a cancel asked for); `fields` are the
    job's own resets written with the claim; `stamp_start` dates `started_at`.
    """
    now = timezone.now()
    token = uuid.uuid4().hex
    rows = model.objects.filter(pk=pk).filter(
        Q(status=PENDING) | Q(status=working, heartbeat_at__lt=now - stale_after)
    )
    if where is not None:
        rows = rows.filter(where)
    if stamp_start:
        fields["started_at"] = now
    claimed = rows.update(status=working, claim_token=token, heartbeat_at=now, **fields)
    return token if claimed == 1 else None


def job_claim_returning(
    *,
    model: type[Model],
    pk: int,
    stale_after: timedelta,
    related: str,
    working: str = RUNNING,
    increment: tuple[str, ...] = (),
    **fields: Any,
) -> tuple[str, Model] | None:
    """`job_claim` (with `started_at` dated), and the row as it is once claimed, its foreign
    key `related` cached on it: what `select_related(related).get(pk=pk)` would then read.

    `increment` names the columns the claim adds one to (an attempts count); `fields` are
    plain values. On PostgreSQL it is one statement, an UPDATE ... RETURNING joined to the
    related row, whose row Django's own converters and `from_db` turn into the instances (a
    worker claims an episode at the start of each: one statement built once costs it far
    less than a claim and a read each built by the ORM; `docs/benchmarks.md`). On another
    database (the SQLite demo) it is `job_claim` and that read.
    """
    alias = router.db_for_write(model)
    connection = connections[alias]
    if connection.vendor != "postgresql":
        increments = {name: F(name) + 1 for name in increment}
        token = job_claim(
            model=model, pk=pk, stale_after=stale_after, working=working, **increments, **fields
        )
        if token is None:
            return None
        return token, model.objects.select_related(related).get(pk=pk)
    plan = _claim_plan(model, related, tuple(fields), increment, alias)
    now = timezone.now()
    token = uuid.uuid4().hex
    values = [working, token, now, now, *fields.values()]
    # Each value as the ORM's UPDATE and filter prepare it.
    params = [f.get_db_prep_save(v, connection) for f, v in zip(plan.written, values, strict=True)]
    params += [
        plan.pk.get_db_prep_value(pk, connection),
        plan.status.get_db_prep_value(PENDING, connection),
        plan.status.get_db_prep_value(working, connection),
        plan.heartbeat.get_db_prep_value(now - stale_after, connection),
    ]
    with connection.cursor() as cursor:
        cursor.execute(plan.sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    row = list(row)
    for pos, converters, col in plan.converters:
        value = row[pos]
        for convert in converters:
            value = convert(value, col, connection)
        row[pos] = value
    # As a select_related read builds them (django.db.models.query.RelatedPopulator).
    split = len(plan.own_names)
    obj = model.from_db(alias, plan.own_names, row[:split])
    other = None
    if row[split + plan.related_pk_pos] is not None:
        other = plan.fk.related_model.from_db(alias, plan.related_names, row[split:])
        if plan.fk.unique:
            plan.fk.remote_field.set_cached_value(other, obj)
    plan.fk.set_cached_value(obj, other)
    return token, obj


@dataclass(frozen=True)
class _ClaimPlan:
    sql: str
    written: list[Field]  # the columns set from parameters, in the statement's order
    pk: Field
    status: Field
    heartbeat: Field
    fk: ForeignKey
    own_names: list[str]  # the attnames of the row's concrete fields (its columns first)
    related_names: list[str]  # and of its related row's (the columns after them)
    related_pk_pos: int
    converters: list[tuple[int, list[Callable], Col]]  # (column, converters, its Col)


@functools.cache
def _claim_plan(
    model: type[Model],
    related: str,
    names: tuple[str, ...],
    increment: tuple[str, ...],
    alias: str,
) -> _ClaimPlan:
    """`job_claim_returning`'s statement for these columns, built once: the claim's WHERE is
    `job_claim`'s filter, every column list is the models' concrete fields."""
    connection = connections[alias]
    quote = connection.ops.quote_name
    meta = model._meta
    fk = meta.get_field(related)
    if not isinstance(fk, ForeignKey):
        raise TypeError(f"job_claim_returning: {related} is not a foreign key")
    other = fk.related_model._meta
    table, other_table = meta.db_table, other.db_table
    written = [
        meta.get_field(name) for name in ("status", "claim_token", "heartbeat_at", "started_at")
    ]
    written += [meta.get_field(name) for name in names]
    added = [meta.get_field(name).column for name in increment]
    status = quote(meta.get_field("status").column)
    heartbeat = quote(meta.get_field("heartbeat_at").column)
    sets = [f"{quote(f.column)} = %s" for f in written]
    sets += [f"{quote(c)} = {quote(table)}.{quote(c)} + 1" for c in added]
    own, theirs = meta.concrete_fields, other.concrete_fields
    columns = [f"claimed.{quote(f.column)}" for f in own]
    columns += [f"claimed_related.{quote(f.column)}" for f in theirs]
    join = "LEFT OUTER JOIN" if fk.null else "INNER JOIN"
    sql = (
        f"WITH claimed AS (UPDATE {quote(table)} SET {', '.join(sets)}"
        f" WHERE {quote(meta.pk.column)} = %s"
        f" AND ({status} = %s OR ({status} = %s AND {heartbeat} < %s))"
        f" RETURNING {', '.join(quote(f.column) for f in own)})"
        f" SELECT {', '.join(columns)} FROM claimed"
        f" {join} {quote(other_table)} claimed_related"
        f" ON claimed_related.{quote(fk.target_field.column)} = claimed.{quote(fk.column)}"
    )
    # The converters the ORM's compiler applies to each column it reads (SQLCompiler
    # .get_converters): a JSON field's text parsed, for one.
    converters = []
    for pos, (field, owner) in enumerate(
        [(f, table) for f in own] + [(f, other_table) for f in theirs]
    ):
        col = field.get_col(owner)
        found = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
        if found:
            converters.append((pos, found, col))
    return _ClaimPlan(
        sql=sql,
        written=written,
        pk=meta.pk,
        status=meta.get_field("status"),
        heartbeat=meta.get_field("heartbeat_at"),
        fk=fk,
        own_names=[f.attname for f in own],
        related_names=[f.attname for f in theirs],
        related_pk_pos=list(theirs).index(other.pk),
        converters=converters,
    )


def job_held(*, model: type[Model], pk: int, token: str, working: str = RUNNING) -> QuerySet:
    """The row, while the worker holding `token` still works on it (else nothing)."""
    return model.objects.filter(pk=pk, claim_token=token, status=working)


def job_heartbeat(
    *, model: type[Model], pk: int, token: str, working: str = RUNNING, **fields: Any
) -> bool:
    """Renew the claim, writing `fields` (progress) with it; False: the claim was lost."""
    values = {"heartbeat_at": timezone.now(), **fields}
    return _update_held(model=model, pk=pk, token=token, working=working, values=values) == 1


def job_finish(
    *,
    model: type[Model],
    pk: int,
    token: str,
    status: str = DONE,
    working: str = RUNNING,
    stamp_finish: bool = True,
    **fields: Any,
) -> bool:
    """End the job as `status` with its results in `fields`; False: the claim was lost.

    `stamp_finish` dates `finished_at` (not when the row lives on past its worker's part: a
    training job submitted, which then runs at its provider)."""
    now = timezone.now()
    values = {"status": status, "heartbeat_at": now, **fields}
    if stamp_finish:
        values["finished_at"] = now
    return _update_held(model=model, pk=pk, token=token, working=working, values=values) == 1


def _update_held(
    *, model: type[Model], pk: int, token: str, working: str, values: dict[str, Any]
) -> int:
    """`job_held(...).update(**values)` as one plain UPDATE; the rows it changed (0 or 1).

    Every episode ends through here (and renews its claim through here, chunk after chunk),
    when a batch's episodes all end together: the ORM would compile that UPDATE each time.
    The values are prepared for the database as the ORM's update
    prepares them; an expression (an `F()`, say) goes through the ORM itself.
    """
    if any(hasattr(value, "resolve_expression") for value in values.values()):
        held = job_held(model=model, pk=pk, token=token, working=working)
        return held.update(**values)
    meta = model._meta
    connection = connections[router.db_for_write(model)]
    quote = connection.ops.quote_name
    sets, params = [], []
    for name, value in values.items():
        field = meta.get_field(name)
        if hasattr(value, "prepare_database_save"):  # a model instance for a foreign key
            value = value.prepare_database_save(field)
        sets.append(f"{quote(field.column)} = %s")
        params.append(field.get_db_prep_save(value, connection=connection))
    held = " AND ".join(
        f"{quote(meta.get_field(name).column)} = %s"
        for name in (meta.pk.name, "claim_token", "status")
    )
    sql = f"UPDATE {quote(meta.db_table)} SET {', '.join(sets)} WHERE {held}"
    with (
        transaction.mark_for_rollback_on_error(using=connection.alias),
        connection.cursor() as cursor,
    ):
        cursor.execute(sql, [*params, meta.pk.get_db_prep_value(pk, connection), token, working])
        return cursor.rowcount


def job_fail(
    *,
    model: type[Model],
    pk: int,
    token: str,
    error: str,
    working: str = RUNNING,
    **fields: Any,
) -> bool:
    """End the job as failed with `error` (already cut to the job's limit): a poison job is
    set aside, never retried. False: the claim was lost."""
    return job_finish(
        model=model, pk=pk, token=token, status=FAILED, working=working, error=error, **fields
    )


def jobs_stale(*, rows: QuerySet, stale_after: timedelta, working: str = RUNNING) -> list[int]:
    """Ids of rows being worked on whose heartbeat is older than `stale_after`."""
    stale = timezone.now() - stale_after
    return list(rows.filter(status=working, heartbeat_at__lt=stale).values_list("pk", flat=True))


def jobs_waiting(*, rows: QuerySet, created_field: str = "created_at") -> list[int]:
    """Ids of pending rows whose message never left (after a grace for on_commit to send it),
    or left long ago without a worker starting them (a message lost with the broker's data)."""
    now = timezone.now()
    grace = now - timedelta(seconds=settings.STUDIO_REQUEUE_GRACE_SECONDS)
    lost = now - timedelta(seconds=settings.STUDIO_REQUEUE_PENDING_SECONDS)
    never_sent = UNSENT & Q(**{f"{created_field}__lt": grace})
    return list(
        rows.filter(never_sent | Q(status=PENDING, enqueued_at__lt=lost)).values_list(
            "pk", flat=True
        )
    )


def jobs_to_resend(
    *,
    rows: QuerySet,
    stale_after: timedelta,
    working: str = RUNNING,
    waiting_rows: QuerySet | None = None,
    created_field: str = "created_at",
) -> list[int]:
    """Ids the periodic requeue sends again: stale ones first (a worker died), then those
    waiting for a message (`studio.queue.resend` sends them and dates `enqueued_at`).

    `waiting_rows` narrows the second look (`rows` by default; an episode's leaves out the
    batches that failed); `created_field` dates a row that has no `created_at` of its own."""
    waiting = rows if waiting_rows is None else waiting_rows
    return jobs_stale(rows=rows, stale_after=stale_after, working=working) + jobs_waiting(
        rows=waiting, created_field=created_field
    )


@dataclass(frozen=True)
class Claim:
    """A claim this worker holds on one row of a kind: what its job writes through, so that
    a worker presumed dead and taken over writes nothing more (every write is refused)."""

    kind: JobKind
    pk: int
    token: str

    def renew(self, *, raise_lost: bool = False, **fields: Any) -> bool:
        return self.kind.renew(self.pk, self.token, raise_lost=raise_lost, **fields)

    def kept(self) -> contextlib.AbstractContextManager[None]:
        return self.kind.kept(self.pk, self.token)

    def finish(self, *, status: str = "", **fields: Any) -> bool:
        return self.kind.finish(self.pk, self.token, status=status, **fields)

    def fail(self, error: str, **fields: Any) -> bool:
        return self.kind.fail(self.pk, self.token, error, **fields)

    def release(self, **fields: Any) -> bool:
        return self.kind.release(self.pk, self.token, **fields)

    def hand_back(self) -> None:
        self.kind.hand_back(self.pk, self.token)

    def checked(self, every: float) -> ClaimCheck:
        """A check of this claim that reads the row at most every `every` seconds."""
        return ClaimCheck(self, every)


class ClaimCheck:
    """Whether a claim is still held, and the row's status, read at most every `every`
    seconds: a job that asks a model many times a second checks before each call (a cancel
    must stop it before its next call) without a read each time. While the database cannot
    be reached it waits (`studio.outages.waited_out`): no call is made that a cancel might
    have forbidden."""

    def __init__(self, claim: Claim, every: float) -> None:
        self.claim = claim
        self.every = every
        self._at = time.monotonic()  # just claimed
        self._status = claim.kind.working

    def check(self) -> None:
        """`ClaimLost` unless the claim is held and its row still being worked on (not
        canceled, nor failed with its parent)."""
        if self.status() != self.claim.kind.working:
            raise ClaimLost(f"{self.claim.kind.name} {self.claim.pk} is no longer worked on")

    def status(self) -> str:
        """The row's status while the claim is held; `ClaimLost` once another worker has it."""
        now = time.monotonic()
        if now - self._at < self.every:
            return self._status
        kind, pk = self.claim.kind, self.claim.pk
        row = waited_out(
            lambda: kind.model.objects.filter(pk=pk).values_list("claim_token", "status").first(),
            what=f"{kind.name} {pk}",
            seconds=settings.STUDIO_DATABASE_OUTAGE_SECONDS,
        )
        if row is None or row[0] != self.claim.token:
            raise ClaimLost(f"{kind.name} {pk} is no longer this worker's")
        self._at, self._status = now, row[1]
        return self._status
