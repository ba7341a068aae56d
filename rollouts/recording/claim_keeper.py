"""This process's hold on the episodes it plays, and its name.

A keeper (`studio.claim_keeper`) renews the claims of every episode the process is playing,
every third of STUDIO_EPISODE_STALE_SECONDS, however long a model call takes: a claim goes
stale only when its worker is gone (killed, frozen, cut off), and then it is taken over
within about that long. Each claim records the worker's name (Celery's node name); a worker
starting again under the same name (the demo's restart, a supervisor's) takes over at once the
episodes its predecessor held, instead of waiting for them to go stale.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import UTC, datetime

from django.utils import timezone

from rollouts.jobs import EPISODE
from rollouts.models import Episode
from studio.claim_keeper import ClaimKeeper

logger = logging.getLogger(__name__)

KEEPER = ClaimKeeper(EPISODE)
keep = KEEPER.keep
let_go = KEEPER.let_go
renew = KEEPER.renew

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


def take_over(name: str) -> list[int]:
    """The episodes a worker of this name held, before this one started: its predecessor is
    gone, so they are made stale now and re-sent (resumed from their last written turn)."""
    mine = KEEPER.held()  # never this process's own (a worker renamed while playing)
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
