"""This process's hold on the episodes it plays, and its name.

One thread renews the claims of every episode the process is playing, every third of
STUDIO_EPISODE_STALE_SECONDS, however long a model call takes: a claim goes stale only when
its worker is gone (killed, frozen, cut off), and then it is taken over within about that
long. Each claim records the worker's name (Celery's node name); a worker starting again
under the same name (the demo's restart, a supervisor's) takes over at once the episodes its
predecessor held, instead of waiting for them to go stale.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from datetime import UTC, datetime

from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from rollouts.jobs import EPISODE
from rollouts.models import Episode

logger = logging.getLogger(__name__)

_held: dict[int, str] = {}
_lock = threading.Lock()
_thread: threading.Thread | None = None
# A process that is not a named worker (`rollout --inline`, a test) is its host and pid.
_name = f"{socket.gethostname()}:{os.getpid()}"

# What a taken-over claim's heartbeat is set to: long stale, whatever the setting.
_LONG_AGO = datetime(2000, 1, 1, tzinfo=UTC)


def worker_name() -> str:
    return _name


def name_worker(name: str) -> None:
    """Called once the worker knows its node name, before its first task."""
    global _name
    _name = name[:200]


def keep(episode_id: int, token: str) -> bool:
    """Renew this claim until `let_go`; True (for `finally: let_go`)."""
    global _thread
    with _lock:
        _held[episode_id] = token
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_renew_forever, name="claim-keeper", daemon=True)
            _thread.start()
    return True


def let_go(episode_id: int) -> None:
    with _lock:
        _held.pop(episode_id, None)


def _renew_forever() -> None:
    while True:
        time.sleep(max(1.0, settings.STUDIO_EPISODE_STALE_SECONDS / 3))
        with _lock:
            held = dict(_held)
        if not held:
            continue
        try:
            renew(held)
        except Exception:  # the database is down: the next round tries again
            logger.warning("could not renew %d episode claims", len(held), exc_info=True)
        finally:
            # One statement every ten seconds: no connection is kept open between them (a
            # test database could not be dropped, a pooler would count it).
            connection.close()


def renew(held: dict[int, str]) -> int:
    """Renew these claims (id -> token) that are still held; how many were."""
    match = Q()
    for episode_id, token in held.items():
        match |= Q(id=episode_id, claim_token=token)
    return Episode.objects.filter(match, status=Episode.Status.RUNNING).update(
        heartbeat_at=timezone.now()
    )


def take_over(name: str) -> list[int]:
    """The episodes a worker of this name held, before this one started: its predecessor is
    gone, so they are made stale now and re-sent (resumed from their last written turn)."""
    with _lock:
        mine = list(_held)  # never this process's own (a worker renamed while playing)
    taken = Episode.objects.filter(status=Episode.Status.RUNNING, worker=name).exclude(id__in=mine)
    ids = list(taken.values_list("id", flat=True))
    if not ids:
        return []
    Episode.objects.filter(id__in=ids, status=Episode.Status.RUNNING, worker=name).update(
        heartbeat_at=_LONG_AGO, lost_worker_at=timezone.now()
    )
    EPISODE.enqueue_many(ids)
    logger.warning("took over %d episodes from the previous worker %s", len(ids), name)
    return ids
