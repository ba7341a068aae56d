"""Sending work to Celery when the broker may be down: one place that knows how it fails.

The row is the truth and the message only a nudge: a send that fails is logged and left to
the periodic requeue (`studio.tasks.jobs_requeue`: every job kind's rows picked with
`studio.claims.jobs_to_resend`), which sends again what is still waiting once the broker is
back. Claims make a second message for the same row harmless.

A task is named, not imported (`"datasets.tasks.dataset_version_export"`): a service that
sends work never imports the task module that calls it back.
"""

from __future__ import annotations

import logging
from typing import Any

import redis.exceptions
from django.utils import timezone
from kombu.exceptions import BatchPublishError, OperationalError

from studio.celery import app as celery_app
from studio.errors import plain_error

logger = logging.getLogger(__name__)

QUEUE_UNREACHABLE = "the task queue is unreachable"
# Publishing retries briefly, so a web request never hangs on a dead broker.
_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2}


# `resend` stamps what it sent in one UPDATE per this many rows, not one per row; it sends
# them to the broker in one round trip per this many too (`_send_run`).
STAMP_EVERY = 200


# A task by its name (sent on the studio's Celery app), or a task or signature of any app.
Task = Any


def send(task: Task, *args: Any, producer: Any = None, queue: str | None = None) -> bool:
    """`task.delay(*args)`, or False (logged) when the broker cannot be reached.

    `producer` (from `_app(task).producer_or_acquire()`) sends many on one connection;
    `queue` overrides the task's route (`studio.jobs.JobKind.calls_model`)."""
    options = {"retry": True, "retry_policy": _RETRY_POLICY, "producer": producer}
    if queue is not None:
        options["queue"] = queue
    try:
        if isinstance(task, str):
            _app(task).send_task(task, args=args, **options)
        else:
            task.apply_async(args=args, **options)
    except (OperationalError, OSError) as exc:
        # Info, not warning: the caller tells the user in one line; the row keeps the state.
        logger.info("%s: %s not sent (%s)", QUEUE_UNREACHABLE, _name(task), plain_error(exc))
        return False
    return True


def _app(task: Task) -> Any:
    return celery_app if isinstance(task, str) else task.app


def _name(task: Task) -> str:
    return task if isinstance(task, str) else task.name


def send_job(model, task: Task, pk: int, *, queue: str | None = None) -> bool:
    """Send the row's task and date its `enqueued_at`; False (the date stays) when the
    broker cannot be reached, for the periodic requeue to send it later."""
    if not send(task, pk, queue=queue):
        return False
    model.objects.filter(pk=pk).update(enqueued_at=timezone.now())
    return True


def resend(model, task: Task, ids: list[int], *, queue: str | None = None) -> int:
    """Send each id, in order; stamp `enqueued_at` on those sent. Returns how many were sent:
    the first ones, up to where the broker failed.

    A row sent but not yet stamped is only sent again by the requeue, which is harmless.
    """
    sent = _send_run(task, ids, queue=queue)
    now = timezone.now()
    for start in range(0, len(sent), STAMP_EVERY):
        model.objects.filter(id__in=sent[start : start + STAMP_EVERY]).update(enqueued_at=now)
    return len(sent)


def _send_run(task: Task, ids: list[int], *, queue: str | None = None) -> list[int]:
    """Send ids on one connection, `STAMP_EVERY` to a round trip (kombu's publish batch, on
    Redis a pipeline; other brokers publish each at once); the ids sent.

    One round trip per message would have a new batch's first episodes playing while the
    last ones are still being sent, each send waiting for a core on a busy host. A round
    trip that fails counts its ids as not sent,
    though some may have arrived ("delivery is uncertain"): a second message finds the row
    claimed or ended, and does nothing.
    """
    sent: list[int] = []
    try:
        with _app(task).producer_or_acquire() as producer, producer.batch() as batch:
            for start in range(0, len(ids), STAMP_EVERY):
                run = ids[start : start + STAMP_EVERY]
                for row_id in run:
                    if not send(task, row_id, producer=producer, queue=queue):
                        return sent
                batch.flush()
                sent += run
    except (OperationalError, OSError, BatchPublishError) as exc:
        # The connection could not be had, or a round trip failed.
        logger.info("%s: %s not sent (%s)", QUEUE_UNREACHABLE, _name(task), plain_error(exc))
    return sent


# A key the periodic requeue keeps in the broker's Redis: when it is gone, so are the messages
# that were there with it (Redis restarted without persistence, as the README starts it, or
# was flushed).
BROKER_MARK = "studio:broker-mark"


def broker_lost_messages() -> bool:
    """Whether the broker lost every message it held since this was last asked: the mark
    this leaves in it is gone (and is set again). False when that cannot be known: another
    broker than Redis (the demo's files outlive a restart), or one that does not answer.

    The periodic requeue then sends again every pending row that was sent, at once, instead
    of after `STUDIO_REQUEUE_PENDING_SECONDS` (an hour): a Redis restart without persistence
    loses the queued messages, and the countdowns of the retries workers were holding. Rows
    whose message is in the new Redis already (sent since it came back) get a second one,
    which their claim makes harmless; so does a deployment's first run, which finds no mark.

    (Comparing each pending row with the messages the broker holds was the other way: but a
    row handed to a process of its own, `rollout --inline`, has no message by design, and
    would have been given to a worker; and reading every message costs as much as the
    queue is long, every minute.)
    """
    if not str(celery_app.conf.broker_url or "").startswith(("redis://", "rediss://")):
        return False
    try:
        with celery_app.connection_for_write() as conn:
            # SET NX answers whether the key was absent (and sets it).
            return bool(conn.default_channel.client.set(BROKER_MARK, "1", nx=True))
    except (OperationalError, OSError, redis.exceptions.RedisError) as exc:
        logger.info("%s: %s", QUEUE_UNREACHABLE, plain_error(exc))
        return False


def broker_answers() -> bool:
    """Whether the broker answers now (one round trip, no retry); always True for the
    embedded filesystem broker, which has no server to lose."""
    if not str(celery_app.conf.broker_url or "").startswith(("redis://", "rediss://")):
        return True
    try:
        with celery_app.connection_for_write() as conn:
            return bool(conn.default_channel.client.ping())
    except (OperationalError, OSError, redis.exceptions.RedisError):
        return False
