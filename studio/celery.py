"""The one Celery app: `celery -A studio worker`, `celery -A studio beat`."""

import gc
import logging
import os

from celery import Celery, bootsteps, signals
from django.dispatch import Signal

logger = logging.getLogger(__name__)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")

app = Celery("studio")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Celery's Django fixup closes every database connection before and after each task unless
# this is set (then it closes them every 2 x this many tasks): instead, connections are
# closed as Django closes them between web requests, when broken or past CONN_MAX_AGE
# (0 by default: after every task, as before).
app.conf.CELERY_DB_REUSE_MAX = 10**9


class _RequeueAfterReconnect(bootsteps.StartStopStep):
    """A worker that connects to the broker again after losing it asks for the periodic
    requeue at once (`studio.tasks.jobs_requeue`, on the control queue), instead of waiting
    for the scheduler's next one (every STUDIO_REQUEUE_EVERY_SECONDS).

    A broker that lost its messages (Redis restarted without persistence) is found out by
    that requeue (`studio.queue.broker_lost_messages`), which sends every waiting job again:
    a batch goes on a few seconds after Redis is back. Each worker asks; only the first
    requeue finds the broker's mark gone, so the jobs are sent again once. Not at a worker's
    first connection: only after a loss."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent, **kwargs) -> None:
        super().__init__(parent, **kwargs)
        self.connected_before = False

    def start(self, parent) -> None:
        if self.connected_before:
            try:
                parent.app.send_task("studio.tasks.jobs_requeue")
            except Exception as exc:  # the scheduler's requeue comes anyway
                logger.warning("could not ask for a requeue after reconnecting: %r", exc)
        self.connected_before = True


app.steps["consumer"].add(_RequeueAfterReconnect)


def _survive_a_channel_without_connection() -> None:
    """Keep a worker alive when it acknowledges, rejects or puts back a message on a Redis
    channel whose connection is gone.

    When Redis goes away Celery closes the consumer's channel (kombu sets its `connection`
    to None, and the closed connection's transport its `client`) and connects again. Work
    the old channel delivered still ends on it: a task whose retry could not be sent while
    Redis was down rejects its message, another acknowledges it, the channel's close puts
    the unacknowledged ones back. Each of these reaches `Channel._connparams` for a new
    client, which reads `self.connection.client.hostname` and raises AttributeError: not a
    connection error, so nothing catches it, "Unrecoverable error", and the worker exits
    (tests/faults reproduce it; see `docs/running-at-scale.md`).

    Nothing can be told to the broker through a channel without a connection, so each of
    those does what it can do locally: the message is left where it is (in Redis's
    unacknowledged set, delivered again after the visibility timeout, where a duplicate is
    harmless since its job's claim decides; or gone with a Redis that lost its data, whose
    jobs the studio's requeue sends again), and the worker goes on, on its new channel.

    The same class of failure, by kombu's and Celery's reports (each workaround can go once
    kombu raises a connection error for a channel without a connection, or skips these
    calls itself):

    - celery/kombu#970 (restoring the unacknowledged messages at a channel's close):
      `QoS.restore_unacked`, also reached through `basic_recover`.
    - celery/celery#6654 (a late acknowledgement on the channel of a lost connection,
      "Couldn't ack"; Celery's answer, `worker_cancel_long_running_tasks_on_connection_loss`,
      cancels such tasks, which would cut every running episode short): `QoS.ack` and
      `QoS.reject` (`requeue` either way: `restore_by_tag` or `_remove_from_indices`).
    - celery/kombu#582 (any command on a closed Redis channel: `_connparams` read a
      connection that was gone): every other path (`restore_by_tag`, `restore_visible`,
      `_remove_from_indices`, `_put`, `_size`, `queue_delete` ...) now raises redis-py's
      ConnectionError there, which Celery and kombu treat as a lost broker (logged, the
      consumer reconnects) instead of a bug that ends the worker.
    """
    from kombu.transport import redis as kombu_redis

    qos_class = kombu_redis.QoS
    if getattr(qos_class.ack, "studio_patched", False):
        return
    connparams, qos_ack, qos_reject, qos_restore_unacked = _calls_that_survive(
        kombu_redis.Channel._connparams,
        qos_class.ack,
        qos_class.reject,
        qos_class.restore_unacked,
    )
    for patched in (qos_ack, qos_reject, qos_restore_unacked, connparams):
        patched.studio_patched = True
    kombu_redis.Channel._connparams = connparams
    qos_class.ack = qos_ack
    qos_class.reject = qos_reject
    qos_class.restore_unacked = qos_restore_unacked


def _calls_that_survive(connparams, ack, reject, restore_unacked) -> tuple:
    """kombu's Redis `Channel._connparams`, `QoS.ack`, `QoS.reject` and
    `QoS.restore_unacked`, each wrapped to do what it can on a channel without connection."""
    import redis.exceptions
    from kombu.transport import virtual

    def connection_gone(channel) -> bool:
        return getattr(channel.connection, "client", None) is None

    def _connparams(self, *args, **kwargs):
        if connection_gone(self):
            raise redis.exceptions.ConnectionError(
                "this broker channel was closed with its connection"
            )
        return connparams(self, *args, **kwargs)

    def left_to_the_broker(what: str) -> None:
        logger.warning(
            "the broker connection is gone: %s left to the broker's redelivery and the "
            "studio's requeue",
            what,
        )

    def qos_ack(self, delivery_tag):
        if connection_gone(self.channel):
            left_to_the_broker("a message done but not acknowledged is")
            return virtual.QoS.ack(self, delivery_tag)  # this worker's own count of it
        return ack(self, delivery_tag)

    def qos_reject(self, delivery_tag, requeue=False):
        if connection_gone(self.channel):
            left_to_the_broker("a rejected message is")
            return virtual.QoS.ack(self, delivery_tag)
        return reject(self, delivery_tag, requeue=requeue)

    def qos_restore_unacked(self, client=None):
        if client is None and connection_gone(self.channel):
            left_to_the_broker(f"{len(self._delivered)} message(s) taken but not done are")
            self._delivered.clear()
            return None
        return restore_unacked(self, client)

    return _connparams, qos_ack, qos_reject, qos_restore_unacked


_survive_a_channel_without_connection()

# How long a `celery worker` thread keeps its PostgreSQL connection between tasks.
WORKER_DB_CONN_MAX_AGE = 300


@signals.task_prerun.connect(weak=False)
@signals.task_postrun.connect(weak=False)
def _close_old_connections(**kwargs) -> None:
    from django.db import close_old_connections

    close_old_connections()


@signals.celeryd_init.connect(weak=False)
def _keep_database_connections(**kwargs) -> None:
    """`celery worker` keeps each thread's PostgreSQL connection from task to task.

    Otherwise each episode of a batch opens its own: a new PostgreSQL backend, its
    authentication and catalogue caches, CPU on both sides, 64 times for a batch of 64 on
    the same cores. A kept connection is checked before a task reuses it (CONN_HEALTH_CHECKS)
    and closed once broken or older than `WORKER_DB_CONN_MAX_AGE`. (The `celery worker`
    command only: in-process test workers close theirs after every task, as before.)
    """
    from django.conf import settings

    database = settings.DATABASES["default"]
    if database["ENGINE"] != "django.db.backends.postgresql":
        return  # SQLite (the demo) costs nothing to open
    database["CONN_MAX_AGE"] = WORKER_DB_CONN_MAX_AGE
    database["CONN_HEALTH_CHECKS"] = True


# Sent once a worker has started, before it freezes what it has built: an app that wants
# something built before the first task (rollouts: the game) connects to it in `ready()`.
worker_warm_up = Signal()


@signals.worker_ready.connect(weak=False)  # `celery worker`, any pool: its main process
@signals.worker_process_init.connect(weak=False)  # each prefork child (and the solo pool)
def _warm_up_and_freeze(**kwargs) -> None:
    """Build what every task needs first, then leave all the worker has built so far out
    of Python's cyclic garbage collections.

    Those objects (Django, the libraries, the game's textures and compiled kernels: hundreds
    of thousands) live as long as the worker, yet each full collection would go over all of
    them with the GIL held, while that worker's episodes wait. Frozen, a full collection
    walks only what came after.
    """
    for receiver, error in worker_warm_up.send_robust(sender=app):
        if error is not None:  # the first task builds it then, and fails with the reason
            logger.error("the worker could not warm up (%s): %r", receiver, error)
    gc.collect()
    gc.freeze()
