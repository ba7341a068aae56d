"""Sending work to Celery when the broker may be down: one place that knows how it fails.

The row is the truth and the message only a nudge: a send that fails is logged and left to
the periodic requeue (beat tasks picking rows with `studio.claims.jobs_to_resend`), which
sends again what is still waiting once the broker is back. Claims make a second message for
the same row harmless.
"""

from __future__ import annotations

import logging
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


def resend(model, task, ids: list[int]) -> int:
    """Send each id; stamp `enqueued_at` on those sent. Stops at the first refused send.

    All go out on one broker connection, and the stamps in one UPDATE per `STAMP_EVERY`
    rows: a batch of 64 episodes took 64 publishes on pooled connections and 64 committed
    UPDATEs (0.3-2.3 s on a busy 2-core host) while its first episodes already played.
    A row sent but not yet stamped is only sent again by the requeue, which is harmless.
    """
    sent = 0
    unstamped: list[int] = []

    def stamp() -> None:
        if unstamped:
            model.objects.filter(id__in=unstamped).update(enqueued_at=timezone.now())
            unstamped.clear()

    try:
        with task.app.producer_or_acquire() as producer:
            for row_id in ids:
                if not send(task, row_id, producer=producer):
                    break
                sent += 1
                unstamped.append(row_id)
                if len(unstamped) >= STAMP_EVERY:
                    stamp()
    except (OperationalError, OSError) as exc:  # the connection itself could not be had
        logger.info("%s: %s not sent (%s)", QUEUE_UNREACHABLE, task.name, plain_error(exc))
    finally:
        stamp()
    return sent
