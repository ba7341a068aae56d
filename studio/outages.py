"""What an outage is, and how a job waits it out: one definition for every job and command.

An outage is a lost connection to the database or the broker: the service is down (or
restarting), the job is not at fault. A job's task retries after one (`retry_after_outage`),
a worker in the middle of its work waits it out (`wait_out`), a periodic task says it in one
line (`outage_said_in_one_line`); none of them fails a job for it.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import redis.exceptions
from django.db import InterfaceError, OperationalError, connection
from kombu.exceptions import OperationalError as BrokerOperationalError

logger = logging.getLogger(__name__)

T = TypeVar("T")

# What a lost connection to the database or the broker raises: the service is down (or
# restarting), the job is not at fault. A job's task retries after it (`outage_countdown`),
# and the job goes on from what it had written; it never fails for it. (psycopg's own errors
# reach us as Django's; redis-py's BusyLoadingError, a restarted Redis loading its data, is
# a ConnectionError; kombu's OperationalError is a publish that found no broker.)
OUTAGES: tuple[type[BaseException], ...] = (
    OperationalError,
    InterfaceError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    BrokerOperationalError,
)
# The longest wait between two tries of a task that met an outage: it starts again at most
# this long after the service is back.
OUTAGE_COUNTDOWN_MAX = 20


# PostgreSQL's errors that say the server went away (class 08, connection exception; 57P01-03,
# shut down by an administrator, crashed, still starting): not the job's fault. Its other
# OperationalErrors (a statement timeout, a disk full) may be, and fail a job as before.
_SERVER_GONE = ("08", "57P01", "57P02", "57P03")


def is_outage(exc: BaseException | None) -> bool:
    """Whether `exc`, or an exception it was raised from, is a lost connection to the
    database or the broker (`OUTAGES`): a service's error re-raised as another is still that
    service being down. A database error the server answered with (a statement timeout, a
    constraint) is not one."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OperationalError):
            return _server_gone(exc)
        if isinstance(exc, OUTAGES):
            return True
        exc = exc.__cause__
        seen += 1
    return False


def _server_gone(exc: OperationalError) -> bool:
    # psycopg's error, which Django's wraps: no SQLSTATE when no server answered at all
    # (refused, closed, "server closed the connection unexpectedly").
    sqlstate = getattr(exc.__cause__, "sqlstate", None) or getattr(exc, "sqlstate", None)
    return sqlstate is None or sqlstate.startswith(_SERVER_GONE)


def outage_countdown(retries: int) -> float:
    """Seconds before a task's next try after an outage: 1, 2, 4, ... up to
    `OUTAGE_COUNTDOWN_MAX`, each shortened at random by up to a quarter, so the hundreds of
    tasks a worker drained while the database was down do not all come back together."""
    full = min(OUTAGE_COUNTDOWN_MAX, 2 ** min(retries, 10))
    return round(full * random.uniform(0.75, 1.0), 2)


@contextlib.contextmanager
def outage_said_in_one_line(task_name: str) -> Iterator[None]:
    """Around a periodic task's work (beat's, every few seconds): the database or the broker
    being down (`is_outage`) is said in one warning line, as the commands say it, not in a
    traceback per run; its next run does the work once the service is back. Anything else
    is raised as before."""
    try:
        yield
    except Exception as exc:
        if not is_outage(exc):
            raise
        text = str(exc).strip()
        reason = text.splitlines()[0][:300] if text else type(exc).__name__
        logger.warning(
            "%s: the database or the task queue is unreachable (%s); its next run tries again",
            task_name,
            reason,
        )


def retry_after_outage(task: Any, exc: BaseException | None = None, **options: Any) -> Exception:
    """The `Retry` a bound job task raises after an outage (`OUTAGES`, or a service's "retry"
    outcome): the message goes back to the broker with a short, growing countdown and no cap
    on tries, and the task acknowledges the one it holds. Not acknowledging it instead would
    leave it with the broker until its visibility timeout (2 h), and acknowledging it as done
    (as a plain failure does) would leave the row waiting for the periodic requeue.

    Should the broker be down too, the retry cannot be sent: the task then fails and the row,
    pending or held with an ageing heartbeat, is sent again by the requeue."""
    retries = task.request.retries
    # Celery reads max_retries=None as "the task's own limit": allow this one more instead.
    return task.retry(
        exc=exc, countdown=outage_countdown(retries), max_retries=retries + 1, **options
    )


def waited_out(
    work: Callable[[], T],
    *,
    what: str,
    seconds: float,
    landed: Callable[[], bool] | None = None,
) -> T:
    """`work()`, tried again while the database is unreachable (`is_outage`), for up to
    `seconds`, backing off from a quarter of a second to five; then the outage goes to the
    caller (a job's service, which leaves the job to be resumed, never failed). Inside a
    transaction it is not retried: the transaction is lost with its connection.

    `landed()`, asked after each wait, says whether a write whose commit was lost with its
    connection was committed after all, so it is not written twice. `what` names the job in
    the warning each wait logs."""
    deadline = time.monotonic() + seconds
    pause = 0.25
    while True:
        try:
            return work()
        except Exception as exc:
            if not (
                is_outage(exc) and not connection.in_atomic_block and time.monotonic() < deadline
            ):
                raise
            logger.warning("%s: database unreachable, waiting", what)
            connection.close()  # the next try opens a new connection
            time.sleep(pause)
            pause = min(pause * 2, 5.0)
            if landed is not None and _landed(landed):
                return None  # type: ignore[return-value]


def _landed(landed: Callable[[], bool]) -> bool:
    try:
        return landed()
    except Exception as exc:
        if not is_outage(exc):
            raise
        return False
