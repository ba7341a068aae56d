"""This process's hold on the probe chunks it asks: one thread renews their claims.

A question's call may take a minute or more (a slow model, retries with backoff), longer
than a claim stays fresh (`PROBE_CHUNK.stale_after()`): the claims are renewed every third
of that window whatever the calls do, so a chunk goes stale only when its worker is gone,
and is then taken over (its answered questions are never asked again).
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import connection
from django.db.models import Q
from django.utils import timezone

from probes.jobs import PROBE_CHUNK
from probes.models import ProbeRunChunk

logger = logging.getLogger(__name__)

_held: dict[int, str] = {}
_lock = threading.Lock()
_thread: threading.Thread | None = None


def keep(chunk_id: int, token: str) -> None:
    """Renew this claim until `let_go`."""
    global _thread
    with _lock:
        _held[chunk_id] = token
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_renew_forever, name="probe-keeper", daemon=True)
            _thread.start()


def let_go(chunk_id: int) -> None:
    with _lock:
        _held.pop(chunk_id, None)


def _renew_forever() -> None:
    while True:
        time.sleep(max(0.5, PROBE_CHUNK.stale_after().total_seconds() / 3))
        with _lock:
            held = dict(_held)
        if not held:
            continue
        try:
            renew(held)
        except Exception:  # the database is down: the next round tries again
            logger.warning("could not renew %d probe chunk claims", len(held), exc_info=True)
        finally:
            # A connection a round (every 10 s by default), not one held open for good: a
            # process whose chunks have ended keeps none, and a test database can be dropped.
            connection.close()


def renew(held: dict[int, str]) -> int:
    """Renew these claims (id -> token) that are still held; how many were."""
    match = Q()
    for chunk_id, token in held.items():
        match |= Q(id=chunk_id, claim_token=token)
    return ProbeRunChunk.objects.filter(match, status=ProbeRunChunk.Status.RUNNING).update(
        heartbeat_at=timezone.now()
    )
