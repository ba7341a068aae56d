"""What every app's tests share: waiting for a condition or a row, moving a time into the
past, and starting this project's processes (a Celery worker, `manage.py`, any Python).

For tests only: no production module imports it (tests/test_layout.py checks), and it
imports nothing but `studio`, as every app may import `studio`.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from django.db import connection
from django.db.models import Model
from django.utils import timezone

from studio.models import ClaimedJob

ROOT = Path(__file__).resolve().parents[1]
# Where a job with `ClaimedJob`'s statuses stops (an export, an import, a bulk flag): what a
# test waits for with `wait_for_row`.
JOB_ENDS = (ClaimedJob.Status.DONE, ClaimedJob.Status.FAILED)

T = TypeVar("T")
M = TypeVar("M", bound=Model)


# --- waiting -------------------------------------------------------------------------------


def wait_until(
    predicate: Callable[[], T],
    *,
    timeout: float,
    every: float = 0.05,
    what: str | Callable[[], str] = "the condition",
) -> T:
    """Call `predicate` every `every` seconds until it returns something true, and return
    that; after `timeout` seconds, fail saying what was waited for (`what`, or what the
    callable `what` says then)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"waited {timeout} s for {said}")
        time.sleep(every)


def wait_for_row(
    model_or_instance: type[M] | M,
    pk: Any = None,
    *,
    statuses: str | Iterable[str],
    timeout: float = 60,
    every: float = 0.05,
    while_waiting: Callable[[], object] | None = None,
) -> M:
    """Read the row again until its status is one of `statuses`, and return it.

    Given an instance, that instance is refreshed in place (and returned). `while_waiting`
    is called between two reads, for a row that moves on only when asked (a beat task's
    service). On timeout, fails with the row's status and its error.
    """
    if isinstance(model_or_instance, type):
        model, instance = model_or_instance, None
    else:
        model, instance = type(model_or_instance), model_or_instance
        pk = instance.pk if pk is None else pk
    wanted = {statuses} if isinstance(statuses, str) else set(statuses)
    row: M | None = instance

    def ended() -> M | None:
        nonlocal row
        if instance is not None:
            instance.refresh_from_db()
        else:
            row = model.objects.get(pk=pk)
        if row.status in wanted:
            return row
        if while_waiting is not None:
            while_waiting()
        return None

    def where_it_stands() -> str:
        error = getattr(row, "error", None) or getattr(row, "errors", None) or ""
        return (
            f"{model.__name__} {pk} to be one of {sorted(wanted)}:"
            f" it is {row.status!r} (error: {error!r})"
        )

    return wait_until(ended, timeout=timeout, every=every, what=where_it_stands)


def backdate(row: Model, *, field: str, seconds: float) -> dt.datetime:
    """Set the row's `field` to `seconds` ago with an UPDATE (and on the instance): a stale
    heartbeat or a requeue window reached at once, instead of slept through."""
    when = timezone.now() - dt.timedelta(seconds=seconds)
    updated = type(row).objects.filter(pk=row.pk).update(**{field: when})
    assert updated == 1, f"{type(row).__name__} {row.pk} is gone"
    setattr(row, field, when)
    return when


# --- processes -----------------------------------------------------------------------------


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment for a child process that uses this test's database."""
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    return {**os.environ, "DATABASE_URL": url, "SECRET_KEY": "test-only", **extra}


class Child(subprocess.Popen):
    """A child process started by `start_python`."""

    own_session = False

    def communicate_all(self, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """Its output once it has exited (killed after `timeout` seconds)."""
        try:
            out, err = self.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.communicate()
            raise
        return subprocess.CompletedProcess(self.args, self.returncode, out, err)

    def kill_all(self) -> None:
        """SIGKILL it, and everything it started if it has a session of its own; wait."""
        if self.poll() is None:
            if self.own_session:
                os.killpg(self.pid, signal.SIGKILL)
            else:
                self.kill()
        self.wait()


def start_python(
    *args: str, env: dict[str, str], quiet: bool = False, own_session: bool = False
) -> Child:
    """This interpreter in a child process, in the project's folder, left running: its
    output captured (read it with `communicate_all`), or dropped if `quiet`; in a session
    of its own if `own_session` (so that `kill_all` reaches its own children too)."""
    output = subprocess.DEVNULL if quiet else subprocess.PIPE
    child = Child(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=output,
        text=True,
        start_new_session=own_session,
    )
    child.own_session = own_session
    return child


def run_python(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`start_python`, waited for: its exit code and output."""
    return start_python(*args, env=env).communicate_all()


def pytest_on_demo_settings(directory: Path, *tests: str) -> subprocess.CompletedProcess[str]:
    """`tests` in a child pytest on `make demo`'s settings: an SQLite database and a var
    directory of its own under `directory`, the filesystem broker (no broker URL), DEBUG=1."""
    left_out = {"DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL", "SECRET_KEY", "STUDIO_MEDIA_ROOT"}
    env = {k: v for k, v in os.environ.items() if k not in left_out}
    env.update(
        DATABASE_URL=f"sqlite:///{directory / 'demo.sqlite3'}",
        STUDIO_VAR_DIR=str(directory / "var"),
        DEBUG="1",
    )
    return run_python("-m", "pytest", "-q", *tests, env=env)


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`python manage.py ...` in a child process, waited for."""
    return run_python("manage.py", *args, env=env)


@dataclass
class CommandOutcome:
    code: int
    stdout: str
    stderr: str

    @property
    def summary(self) -> dict:
        """The JSON object a command prints last."""
        return json.loads(self.stdout.strip().splitlines()[-1])


def run_command(name: str, *args: str) -> CommandOutcome:
    """A management command run in this process as from a shell: its exit status, stdout and
    stderr, its errors printed as the command prints them (not raised)."""
    from django.core.management import call_command, get_commands, load_command_class

    out, err = io.StringIO(), io.StringIO()
    command = type(load_command_class(get_commands()[name], name))(stdout=out, stderr=err)
    command._called_from_command_line = True
    try:
        call_command(command, *args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return CommandOutcome(code, out.getvalue(), err.getvalue())


# --- the Celery worker ---------------------------------------------------------------------

WORKER_ARGS = (
    "-m",
    "celery",
    "-A",
    "studio",
    "worker",
    "--pool",
    "solo",
    "--loglevel",
    "WARNING",
    "--without-gossip",
    "--without-mingle",
    "--without-heartbeat",
)


@contextmanager
def celery_worker_running(
    *, process: bool = False, env: dict[str, str] | None = None, concurrency: int = 4
) -> Iterator[Any]:
    """A real Celery worker consuming from the real broker, its queue purged before and after.

    By default in threads of this process (`concurrency` of them): the worker's connections
    see what the test committed, so the test needs `transactional_db`. With `process=True`,
    a `celery -A studio worker` child process (one task at a time) in a session of its own,
    with the environment `env` (default `subprocess_env()`): a test may SIGKILL it mid-task
    with `.kill_all()`; it is killed on leaving, if still running.
    """
    from studio.celery import app

    broker = os.environ.get("CELERY_BROKER_URL", "")
    if not broker.startswith("redis://"):
        pytest.fail("tests need CELERY_BROKER_URL=redis://... (make test sets it)")
    app.conf.broker_url = broker
    app.conf.task_always_eager = False
    queue_purge()
    if process:
        child = start_python(
            *WORKER_ARGS, env=env or subprocess_env(), quiet=True, own_session=True
        )
        try:
            yield child
        finally:
            child.kill_all()
    else:
        from celery.contrib.testing.worker import start_worker

        with start_worker(
            app,
            pool="threads",
            concurrency=concurrency,
            perform_ping_check=False,
            shutdown_timeout=30,
        ) as worker:
            yield worker
    queue_purge()


def queue_purge() -> None:
    """Drop every message waiting in the broker's queues (a former test's, a killed run's)."""
    from studio.celery import app

    with app.connection_for_write() as conn:
        for name in app.amqp.queues:
            conn.default_channel.queue_purge(name)


def queue_drained(timeout: float = 30) -> None:
    """Wait until the broker holds no message and the worker has had time to finish one."""
    from studio.celery import app

    def nothing_waits() -> bool:
        with app.connection_for_write() as conn:
            channel = conn.default_channel
            return not any(channel.queue_declare(name).message_count for name in app.amqp.queues)

    wait_until(nothing_waits, timeout=timeout, every=0.1, what="the broker's queue to be empty")
    time.sleep(1.0)  # the last one taken may still be running
