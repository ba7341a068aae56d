"""Sending work to Celery when the broker may be down: one place that knows how it fails.

The row is the truth and the message only a nudge: a send that fails is logged and left to
the periodic requeue (beat tasks picking rows with `studio.claims.jobs_to_resend`), which
sends again what is still waiting once the broker is back. Claims make a second message for
the same row harmless.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.utils import timezone
from kombu.exceptions import OperationalError

from studio.errors import plain_error

logger = logging.getLogger(__name__)

QUEUE_UNREACHABLE = "the task queue is unreachable"
# Publishing retries briefly, so a web request never hangs on a dead broker.
_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2}


# `resend` stamps what it sent in one UPDATE per this many rows, not one per row.
STAMP_EVERY = 200
# ... and splits ids over several connections only in runs of at least this many.
MIN_RUN = 8


def send(task: Any, *args: Any, producer: Any = None) -> bool:
    """`task.delay(*args)`, or False (logged) when the broker cannot be reached.

    `producer` (from `task.app.producer_or_acquire()`) sends many on one connection."""
    try:
        task.apply_async(args=args, retry=True, retry_policy=_RETRY_POLICY, producer=producer)
    except (OperationalError, OSError) as exc:
        # Info, not warning: the caller tells the user in one line; the row keeps the state.
        logger.info("%s: %s not sent (%s)", QUEUE_UNREACHABLE, task.name, plain_error(exc))
        return False
    return True


def send_job(model, task, pk: int) -> bool:
    """Send the row's task and date its `enqueued_at`; False (the date stays) when the
    broker cannot be reached, for the periodic requeue to send it later."""
    if not send(task, pk):
        return False
    model.objects.filter(pk=pk).update(enqueued_at=timezone.now())
    return True


def resend(model, task, ids: list[int], *, connections: int = 1) -> int:
    """Send each id; stamp `enqueued_at` on those sent. Returns how many were sent.

    With one connection (the requeues), all go out on it in order and sending stops at the
    first refused send, so the ids sent are the first ones. With `connections` > 1 (a new
    batch's episodes) the ids are split in that many runs, each sent in order on a broker
    connection of its own, in threads: a publish waits for the broker's answer, and on a busy
    host each wait also waits for a core, one after another (64 episodes took 0.4-0.8 s to
    send while the first ones already played). The stamps go in one UPDATE per
    `STAMP_EVERY` rows, after the sends (were: 64 committed UPDATEs). A row sent but not yet
    stamped is only sent again by the requeue, which is harmless.
    """
    runs = max(1, min(connections, len(ids) // MIN_RUN))
    if runs <= 1:
        sent = _send_run(task, ids)
    else:
        size = -(-len(ids) // runs)
        with ThreadPoolExecutor(max_workers=runs, thread_name_prefix="resend") as pool:
            sent = [
                row_id
                for run in pool.map(
                    lambda start: _send_run(task, ids[start : start + size]),
                    range(0, len(ids), size),
                )
                for row_id in run
            ]
    now = timezone.now()
    for start in range(0, len(sent), STAMP_EVERY):
        model.objects.filter(id__in=sent[start : start + STAMP_EVERY]).update(enqueued_at=now)
    return len(sent)


def _send_run(task: Any, ids: list[int]) -> list[int]:
    """Send ids in order on one connection, up to the first refused send; the ids sent."""
    sent: list[int] = []
    try:
        with task.app.producer_or_acquire() as producer:
            for row_id in ids:
                if not send(task, row_id, producer=producer):
                    break
                sent.append(row_id)
    except (OperationalError, OSError) as exc:  # the connection itself could not be had
        logger.info("%s: %s not sent (%s)", QUEUE_UNREACHABLE, task.name, plain_error(exc))
    return sent
