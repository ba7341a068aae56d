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


def _survive_restore_without_connection() -> None:
    """Keep a worker alive when Redis goes away while it holds a retry's countdown.

    On a lost connection Celery closes the consumer's channel, and kombu (5.7) then puts the
    messages the worker had taken but not acknowledged back in the queue through that
    channel; by then the channel's transport has no connection left (`client` is None), and
    building a new one raised AttributeError("'NoneType' object has no attribute
    'hostname'"), which no one catches: "Unrecoverable error", the worker exited (seen with
    a training submission's countdown retry held; tests/faults reproduce it). Without a
    connection the messages cannot be put back by anyone: they are left where they are (in
    Redis's unacknowledged set, delivered again after the visibility timeout, or gone with a
    Redis that lost its data: the studio's requeue sends their jobs again), and the worker
    reconnects as for any other loss."""
    from kombu.transport import redis as kombu_redis

    restore = kombu_redis.QoS.restore_unacked
    if getattr(restore, "studio_patched", False):
        return

    def restore_unacked(self, client=None):
        if client is None and getattr(self.channel.connection, "client", None) is None:
            logger.warning(
                "the broker connection is gone: %d message(s) taken but not acknowledged are "
                "left to the broker's redelivery and the studio's requeue",
                len(self._delivered),
            )
            self._delivered.clear()
            return None
        return restore(self, client)

    restore_unacked.studio_patched = True
    kombu_redis.QoS.restore_unacked = restore_unacked


_survive_restore_without_connection()

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

    Those objects (Django, the libraries, the game's textures and compiled kernels: ~250,000)
    live as long as the worker, yet each full collection went over all of them with the GIL
    held: 110-118 ms of CPU, and in one timed run of `benchmarks/vlm_concurrency.py` 197 ms
    during which that worker's 16 episodes waited. Frozen, a full collection walks only what
    came after.
    """
    for receiver, error in worker_warm_up.send_robust(sender=app):
        if error is not None:  # the first task builds it then, and fails with the reason
            logger.error("the worker could not warm up (%s): %r", receiver, error)
    gc.collect()
    gc.freeze()
