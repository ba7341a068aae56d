"""A process's hold on the job rows it works on: one thread renews their claims.

A claimed job (an episode, a probe run's chunk) may wait a minute or more on one model call,
longer than its claim stays fresh (its kind's stale window): a keeper renews every claim its
process holds every third of that window, whatever the calls do. A claim then goes stale only
when its worker is gone (killed, frozen, cut off), and is taken over within about that long.
Each kind that needs it has one keeper (`ClaimKeeper(kind)`); one thread each, started with
the first claim kept.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from django.db import connection
from django.db.models import Q
from django.utils import timezone

if TYPE_CHECKING:
    from studio.jobs import JobKind

logger = logging.getLogger(__name__)


class ClaimKeeper:
    def __init__(self, kind: JobKind) -> None:
        self.kind = kind
        self._held: dict[int, str] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def keep(self, pk: int, token: str) -> bool:
        """Renew this claim until `let_go`; True (for `finally: let_go`)."""
        with self._lock:
            self._held[pk] = token
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

    def _renew_forever(self) -> None:
        while True:
            time.sleep(max(0.5, self.kind.stale_after().total_seconds() / 3))
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
