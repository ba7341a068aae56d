"""Sending work to Celery when the broker may be down: one place that knows how it fails.

The row is the truth and the message only a nudge: a send that fails is logged and left to
the periodic requeue (`rollouts.services.work_requeue`), which sends again what is still
waiting once the broker is back. Claims make a second message for the same row harmless.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q, QuerySet
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


def waiting_ids(rows: QuerySet, *, created_field: str) -> list[int]:
    """Pending rows whose message never left (after a grace for on_commit to send it), or
    left long ago without a worker starting them (a message lost with the broker's data)."""
    now = timezone.now()
    grace = now - timedelta(seconds=settings.STUDIO_REQUEUE_GRACE_SECONDS)
    lost = now - timedelta(seconds=settings.STUDIO_REQUEUE_PENDING_SECONDS)
    return list(
        rows.filter(status="pending")
        .filter(
            Q(enqueued_at__isnull=True, **{f"{created_field}__lt": grace}) | Q(enqueued_at__lt=lost)
        )
        .values_list("id", flat=True)
    )


def resend(model, task, ids: list[int]) -> int:
    """Send each id; stamp `enqueued_at` on those sent. Stops at the first refused send."""
    sent = 0
    for row_id in ids:
        if not send(task, row_id):
            break
        model.objects.filter(id=row_id).update(enqueued_at=timezone.now())
        sent += 1
    return sent
