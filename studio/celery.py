"""The one Celery app: `celery -A studio worker`, `celery -A studio beat`."""

import os

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")

app = Celery("studio")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# How long a worker thread keeps its database connection between tasks.
WORKER_DB_CONN_MAX_AGE = 300


@signals.celeryd_init.connect(weak=False)
def _keep_database_connections(conf=None, **kwargs) -> None:
    """`celery worker` keeps each thread's PostgreSQL connection from task to task.

    Celery's Django fixup closes every connection before and after each task, so each
    episode of a batch opened its own: a new PostgreSQL backend, its catalogue caches and
    authentication, CPU on both sides of it, 64 times for a batch of 64 on the same cores.
    Instead, as Django does between web requests: a connection is checked before a task
    reuses it, and closed once broken or older than `WORKER_DB_CONN_MAX_AGE`.
    (The `celery worker` command only: in-process test workers close theirs as before.)
    """
    from django.conf import settings

    database = settings.DATABASES["default"]
    if database["ENGINE"] != "django.db.backends.postgresql":
        return  # SQLite (the demo) costs nothing to open
    # The fixup then closes connections only every 2 x this many tasks: never, in practice.
    conf.CELERY_DB_REUSE_MAX = 10**9
    database["CONN_MAX_AGE"] = WORKER_DB_CONN_MAX_AGE
    database["CONN_HEALTH_CHECKS"] = True
    signals.task_prerun.connect(_close_old_connections, weak=False)
    signals.task_postrun.connect(_close_old_connections, weak=False)


def _close_old_connections(**kwargs) -> None:
    from django.db import close_old_connections

    close_old_connections()
