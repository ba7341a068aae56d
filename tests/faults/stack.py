"""A studio of the test's own, to break: a PostgreSQL cluster, a Redis, Celery workers and the
scheduler, each a real process the test may stop, restart or kill.

The cluster is made by `initdb` (run as the `postgres` system user when the tests run as
root: PostgreSQL refuses to run as root) on a port and a socket folder of its own under /tmp,
and started with `pg_ctl`; Redis runs as the README starts it, without persistence
(`--save "" --appendonly no`), so a restart loses every message it held. Nothing here touches
the PostgreSQL or the Redis the other tests use.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def postgres_bin() -> Path | None:
    """The newest PostgreSQL server installed (Debian's layout), or None."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4])
    )
    return Path(found[-1]).parent if found else None


def _as_postgres(command: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root; as anyone else it runs as that user.
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *command]
    return command


class PostgresCluster:
    """A cluster of the test's own: `initdb`, `pg_ctl start`, `stop`, `restart`."""

    def __init__(self, root: Path) -> None:
        binaries = postgres_bin()
        assert binaries is not None, "no PostgreSQL server under /usr/lib/postgresql"
        self.bin = binaries
        self.root = root
        self.data = root / "data"
        self.sockets = root / "sockets"
        self.log = root / "postgresql.log"
        self.port = free_port()
        self.database = "studio"

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{self.database}"

    def _run(self, *args: str) -> None:
        command = _as_postgres([str(self.bin / args[0]), *args[1:]])
        # Into a file, not a pipe: a server started by pg_ctl would hold a pipe open, and
        # reading it to its end would wait for the server to stop.
        with tempfile.TemporaryFile("w+") as said:
            done = subprocess.run(command, stdout=said, stderr=said, timeout=120)
            said.seek(0)
            assert done.returncode == 0, f"{' '.join(args[:2])}: {said.read()}"

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.sockets.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
            shutil.chown(self.sockets, "postgres")
        self._run(
            "initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8",
            "--no-sync",
        )  # fmt: skip
        self.start()
        with psycopg.connect(self.admin_dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.database}"')

    def _options(self) -> list[str]:
        options = (
            f"-p {self.port} -k {self.sockets} -c listen_addresses=127.0.0.1"
            " -c fsync=off -c synchronous_commit=off -c max_connections=200"
        )
        return ["-D", str(self.data), "-l", str(self.log), "-o", options, "-w"]

    def start(self) -> None:
        self._run("pg_ctl", *self._options(), "start")

    def stop(self) -> None:
        """`-m fast`: every connection is cut at once, as a restart by an operator does."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def restart(self) -> None:
        self._run("pg_ctl", *self._options(), "-m", "fast", "restart")

    def destroy(self) -> None:
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def admin_dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def rows(self, sql: str, *params: object) -> list[tuple]:
        """The rows of one query on a connection of its own (the server may have restarted
        since the last)."""
        dsn = f"host=127.0.0.1 port={self.port} user=postgres dbname={self.database}"
        with psycopg.connect(dsn, connect_timeout=5) as conn:
            return conn.execute(sql, params).fetchall()


class RedisServer:
    """A Redis of the test's own, without persistence: a restart loses what it held."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.root),
                "--logfile", str(self.root / "redis.log"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while not self.answers():
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)

    def answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # no persistence: nothing is saved
            self.process.wait(timeout=30)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


class Processes:
    """The studio's own processes (workers, the scheduler, commands), each in a session of
    its own with its output in a file; all killed on leaving."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.env = env
        self.children: dict[str, subprocess.Popen] = {}

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "w")  # noqa: SIM115 (closed with the child)
        child = subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.children[name] = child
        return child

    def worker(self, name: str, *, threads: int, queues: tuple[str, ...] = ()) -> subprocess.Popen:
        """`celery -A studio worker` on threads: every queue the studio declares, or `queues`."""
        return self.start(
            name, "-m", "celery", "-A", "studio", "worker", "--pool", "threads",
            "--concurrency", str(threads), "-n", f"{name}@%h", "--without-gossip",
            "--without-mingle", "--loglevel", "INFO",
            *(("-Q", ",".join(queues)) if queues else ()),
        )  # fmt: skip

    def worker_on(self, name: str, *, queue: str) -> subprocess.Popen:
        """A worker of two threads that consumes only `queue` (one the test sends to)."""
        return self.worker(name, threads=2, queues=(queue,))

    def scheduler(self) -> subprocess.Popen:
        return self.start(
            "beat", "-m", "celery", "-A", "studio", "beat", "--loglevel", "INFO",
            "--schedule", str(self.root / "celerybeat-schedule"), "--pidfile=",
        )  # fmt: skip

    def log(self, name: str, lines: int = 60) -> str:
        text = (self.root / f"{name}.log").read_text(errors="replace").splitlines()
        return f"--- {name} (last {lines} lines) ---\n" + "\n".join(text[-lines:])

    def logs(self, lines: int = 60) -> str:
        return "\n".join(self.log(name, lines) for name in self.children)

    def alive(self) -> dict[str, bool]:
        return {name: child.poll() is None for name, child in self.children.items()}

    def stop_all(self) -> None:
        for child in self.children.values():
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def studio_env(*, database_url: str, broker_url: str, media: Path) -> dict[str, str]:
    """The environment of the studio's processes: this cluster and this Redis, every other
    setting at its default (none of the caller's STUDIO_* variables)."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("STUDIO_", "CELERY_", "DATABASE_", "REDIS_", "OPENAI_"))
    }
    env.update(
        DATABASE_URL=database_url,
        CELERY_BROKER_URL=broker_url,
        SECRET_KEY="test-only",
        STUDIO_MEDIA_ROOT=str(media),
        DJANGO_SETTINGS_MODULE="studio.settings",
        PYTHONUNBUFFERED="1",
        # The workers run as root in a container: no lecture.
        PYTHONWARNINGS="ignore:You're running the worker with superuser privileges",
    )
    return env


@contextlib.contextmanager
def processes(root: Path, env: dict[str, str]) -> Iterator[Processes]:
    running = Processes(root, env)
    try:
        yield running
    finally:
        running.stop_all()
