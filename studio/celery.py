"""The one Celery app: `celery -A studio worker`, `celery -A studio beat`."""

import gc
import logging
import os

from celery import Celery, signals
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
