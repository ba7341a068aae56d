"""A process's hold on the job rows it works on: one thread per job kind renews their claims.

A claimed job may stay silent longer than its claim stays fresh (its kind's stale window): an
episode or a probe chunk waits a minute or more on one model call, an export zips for a
while. The kind's keeper (`keeper_of(kind)`, through `JobKind.kept`) renews every claim of
that kind its process holds every third of that window, whatever the jobs do. A claim then
goes stale only when its worker is gone (killed, frozen, cut off), and is taken over within
about that long. This is the one way a claim is kept alive; a job's progress written through
its claim (`JobKind.renew`) renews it too.

Each claim of a kind whose rows have a `worker` field also records the worker's name
(Celery's node name, `worker_name`): a worker that starts again under the same name (the
demo's restart, a supervisor's) takes over at once what its predecessor held
(`studio.jobs.take_over_all`), instead of waiting for it to go stale.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from datetime import UTC, datetime
from typing import Any

from django.db import connection
from django.db.models import Q
from django.utils import timezone

# A job kind (`studio.jobs.JobKind`, which imports this module): its name, model, working
# status, stale window, `taken_over` and `enqueue_many` are what a keeper reads.
JobKind = Any

logger = logging.getLogger(__name__)

# A process that is not a named worker (`rollout --inline`, a test) is its host and pid.
_name = f"{socket.gethostname()}:{os.getpid()}"
# What a taken-over claim's heartbeat is set to: long stale, whatever the setting.
_LONG_AGO = datetime(2000, 1, 1, tzinfo=UTC)
_keepers: dict[str, ClaimKeeper] = {}
_keepers_lock = threading.Lock()


def worker_name() -> str:
    return _name


def name_worker(name: str) -> None:
    """Called once the worker knows its node name, before its first task."""
    global _name
    _name = name[:200]


def keeper_of(kind: JobKind) -> ClaimKeeper:
    """The kind's one keeper in this process (made at its first use)."""
    with _keepers_lock:
        keeper = _keepers.get(kind.name)
        if keeper is None:
            keeper = _keepers[kind.name] = ClaimKeeper(kind)
        return keeper


class ClaimKeeper:
    def __init__(self, kind: JobKind) -> None:
        self.kind = kind
        self._held: dict[int, str] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        # Set by `keep` when the stale window is now shorter than the one the thread waits
        # on (a setting changed): it renews at once and waits on the new one.
        self._wake = threading.Event()
        self._every = 0.0

    def keep(self, pk: int, token: str) -> bool:
        """Renew this claim until `let_go`; True (for `finally: let_go`)."""
        with self._lock:
            self._held[pk] = token
            if self._every_now() < self._every:
                self._wake.set()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._renew_forever, name=f"{self.kind.name}-keeper", daemon=True
                )
                self._thread.start()
        return True

    def let_go(self, pk: int) -> None:
        with self._lock:
            self._held.pop(pk, None)

    def held(self) -> list[int]:
        with self._lock:
            return list(self._held)

    def renew(self, held: dict[int, str]) -> int:
        """Renew these claims (pk -> token) that are still held; how many were."""
        match = Q()
        for pk, token in held.items():
            match |= Q(pk=pk, claim_token=token)
        return self.kind.model.objects.filter(match, status=self.kind.working).update(
            heartbeat_at=timezone.now()
        )

    def take_over(self, name: str) -> list[int]:
        """The rows a worker of this name held before this one started (its model has a
        `worker` field): its predecessor is gone, so they are made stale now and sent again."""
        model, working = self.kind.model, self.kind.working
        held = model.objects.filter(status=working, worker=name).exclude(pk__in=self.held())
        ids = list(held.values_list("pk", flat=True))
        if not ids:
            return []
        fields = self.kind.taken_over() if self.kind.taken_over is not None else {}
        model.objects.filter(pk__in=ids, status=working, worker=name).update(
            heartbeat_at=_LONG_AGO, **fields
        )
        self.kind.enqueue_many(ids)
        logger.warning(
            "took over %d %s from the previous worker %s", len(ids), self.kind.name, name
        )
        return ids

    def _every_now(self) -> float:
        """How often the claims are renewed: every third of the stale window."""
        return max(0.5, self.kind.stale_after().total_seconds() / 3)

    def _renew_forever(self) -> None:
        while True:
            self._every = self._every_now()
            self._wake.wait(self._every)
            self._wake.clear()
            with self._lock:
                held = dict(self._held)
            if not held:
                continue
            try:
                self.renew(held)
            except Exception:  # the database is down: the next round tries again
                logger.warning("could not renew %d %s claims", len(held), self.kind.name)
            finally:
                # A connection a round (every 10 s by default), not one held open for good: a
                # process whose jobs have ended keeps none, and a test database can be dropped.
                connection.close()
