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


def send(task: Any, *args: Any) -> bool:
    """`task.delay(*args)`, or False (logged) when the broker cannot be reached."""
    try:
        task.apply_async(args=args, retry=True, retry_policy=_RETRY_POLICY)
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
    """Send each id as `send_job` does. Stops at the first refused send."""
    sent = 0
    for row_id in ids:
        if not send_job(model, task, row_id):
            break
        sent += 1
    return sent
