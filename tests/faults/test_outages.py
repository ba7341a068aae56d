"""Faults in the database or the broker are not the episodes' fault (`docs/running-at-scale.md`).

A studio of the test's own (`tests.faults.stack`: a PostgreSQL cluster, a Redis without
persistence, two thread-pool Celery workers and the scheduler, all real processes, at the
default settings) plays a model batch against a local chat endpoint; mid-batch PostgreSQL
is restarted (`pg_ctl -m fast restart`), or stopped for 30 s, or Redis is restarted. Every
episode must then finish, none fail, no turn be written twice, within two minutes of the
service's return.

The endpoint plays a scripted policy through the model protocol: its answer is a function of
the request alone, so a turn replayed after a resume asks exactly what it asked the first time
(the same frames, the same history) and the game goes on as it would have; it never fails a
call, so every request beyond one per recorded turn is a call paid twice.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rollouts.tests.openai_server import ChatServer, Reply, tool_call
from tests.faults.stack import (
    ROOT,
    PostgresCluster,
    Processes,
    RedisServer,
    postgres_bin,
    processes,
    studio_env,
)

pytestmark = pytest.mark.skipif(
    postgres_bin() is None, reason="needs a PostgreSQL server under /usr/lib/postgresql"
)

SEEDS = 12  # seeds 0-11: more than the workers' 8 threads, so some wait in the queue
STEPS = 40
CALL_SECONDS = 0.25  # the endpoint's latency: a batch lasts long enough to break mid-way
RECOVERY_SECONDS = 120  # every episode ended within this of the service's return
ACTIONS = ("move_left", "move_right", "move_up", "move_down", "do", "noop")


@dataclass
class Stack:
    root: Path
    postgres: PostgresCluster
    redis: RedisServer
    env: dict[str, str]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    root = Path(tempfile.mkdtemp(prefix="studio-faults-"))
    root.chmod(0o755)  # the cluster's own folder inside it belongs to `postgres`
    postgres = PostgresCluster(root / "postgres")
    redis = RedisServer(root / "redis")
    try:
        postgres.init()
        redis.start()
        env = studio_env(database_url=postgres.url, broker_url=redis.url, media=root / "media")
        migrated = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v0"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert migrated.returncode == 0, migrated.stderr
        yield Stack(root=root, postgres=postgres, redis=redis, env=env)
    finally:
        redis.stop()
        postgres.destroy()
        shutil.rmtree(root, ignore_errors=True)


class Endpoint(ChatServer):
    """The chat endpoint: each answer a function of its request; every request counted."""

    def __init__(self) -> None:
        super().__init__(delay=CALL_SECONDS)
        self.responder = self._answer_for

    def _answer_for(self, body: dict) -> Reply:
        digest = hashlib.sha256(json.dumps(body["messages"], sort_keys=True).encode()).digest()
        return tool_call(ACTIONS[digest[0] % len(ACTIONS)])

    def repeated(self) -> int:
        """Requests beyond one per turn of the batch: calls paid twice. (Not told apart by
        content: the first request of two seeds can be alike, the same patch of grass.)"""
        return len(self.requests) - SEEDS * STEPS


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    server = Endpoint().start()
    yield server
    server.stop()


@pytest.fixture
def studio(stack: Stack, request) -> Iterator[Processes]:
    """Two workers of 4 threads and the scheduler, in a folder of this test's own."""
    folder = stack.root / request.node.name
    folder.mkdir()
    with processes(folder, stack.env) as running:
        running.worker("faults1", threads=4)
        running.worker("faults2", threads=4)
        running.scheduler()
        yield running


def _rollout(stack: Stack, endpoint: Endpoint, *extra: str) -> list[str]:
    return [
        "manage.py", "rollout", "--policy", "openai", "--model", "fault-model",
        "--base-url", endpoint.url, "--seeds", f"0-{SEEDS - 1}", "--steps", str(STEPS),
        "--history-frames", "1", "--concurrency", "16", *extra,
    ]  # fmt: skip


def batch_start(stack: Stack, endpoint: Endpoint) -> int:
    done = subprocess.run(
        [sys.executable, *_rollout(stack, endpoint)],
        cwd=ROOT,
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])["batch_id"]


def _last_batch(stack: Stack) -> int:
    return stack.postgres.rows("SELECT coalesce(max(id), 0) FROM rollouts_rolloutbatch")[0][0]


def turns_written(stack: Stack, batch_id: int) -> int:
    return stack.postgres.rows(
        "SELECT count(*) FROM rollouts_turn t JOIN rollouts_episode e ON e.id = t.episode_id"
        " WHERE e.batch_id = %s",
        batch_id,
    )[0][0]


def wait_for_turns(stack: Stack, batch_id: int, count: int, timeout: float = 120) -> None:
    """Until the batch has written `count` turns: it is under way, with episodes running."""
    deadline = time.monotonic() + timeout
    while turns_written(stack, batch_id) < count:
        assert time.monotonic() < deadline, f"batch {batch_id} never wrote {count} turns"
        time.sleep(0.2)


def episodes(stack: Stack, batch_id: int) -> list[tuple]:
    """(seed, status, steps, turns, distinct turn indexes, highest index, error) each."""
    return stack.postgres.rows(
        "SELECT e.seed, e.status, e.steps, count(t.id), count(DISTINCT t.index),"
        " coalesce(max(t.index), -1), e.error"
        " FROM rollouts_episode e LEFT JOIN rollouts_turn t ON t.episode_id = e.id"
        " WHERE e.batch_id = %s GROUP BY e.id ORDER BY e.seed",
        batch_id,
    )


def wait_for_the_end(stack: Stack, studio: Processes, batch_id: int, since: float) -> float:
    """Seconds from `since` (the service's return) until every episode has ended; fails,
    with what each episode and process says, after `RECOVERY_SECONDS`."""
    ended = ("finished", "failed", "canceled")
    while True:
        try:
            rows = episodes(stack, batch_id)
        except Exception:  # the database is not back yet: it counts against the time
            rows = []
        if rows and all(row[1] in ended for row in rows):
            return time.monotonic() - since
        if time.monotonic() - since > RECOVERY_SECONDS:
            raise AssertionError(
                f"batch {batch_id} not over {RECOVERY_SECONDS} s after the service came back:"
                f"\n{_table(rows)}\nprocesses alive: {studio.alive()}\n{studio.logs()}"
            )
        time.sleep(0.5)


def _retries(studio: Processes) -> int:
    """Episode tasks sent back to the broker for a later try (after an outage, or busy)."""
    return sum(
        line.count("episode_run[") and "Retry in" in line
        for name in ("faults1", "faults2")
        for line in (studio.root / f"{name}.log").read_text(errors="replace").splitlines()
    )


def _table(rows: list[tuple]) -> str:
    return "\n".join(
        f"seed {seed}: {status}, {steps} steps, {turns} turns ({distinct} indexes, last"
        f" {last}) {error[:300]!r}"
        for seed, status, steps, turns, distinct, last, error in rows
    )


def assert_every_episode_played_once(
    stack: Stack, studio: Processes, endpoint: Endpoint, batch_id: int, *, in_flight: int
) -> None:
    rows = episodes(stack, batch_id)
    detail = f"\n{_table(rows)}\n{studio.logs()}"
    assert [row[0] for row in rows] == list(range(SEEDS)), detail
    assert {row[1] for row in rows} == {"finished"}, detail
    for seed, _status, steps, turns, distinct, last, error in rows:
        assert (steps, turns, distinct, last) == (STEPS, STEPS, STEPS, STEPS - 1), (seed, detail)
        assert error == "", (seed, detail)
    # No episode task failed (a failure is acknowledged as done): they were retried.
    logs = "".join(
        (studio.root / f"{name}.log").read_text(errors="replace") for name in ("faults1", "faults2")
    )
    failed = [line for line in logs.splitlines() if "episode_run[" in line and "raised" in line]
    assert failed == [], failed
    # One call per turn (the endpoint never fails one), plus at most the calls in flight
    # when the service went (one per running episode): a turn already recorded is never
    # asked again.
    assert 0 <= endpoint.repeated() <= in_flight, (endpoint.repeated(), detail)


def test_it_finishes_every_episode_of_a_batch_across_a_postgresql_restart(
    stack: Stack, studio: Processes, endpoint: Endpoint
):
    batch_id = batch_start(stack, endpoint)
    wait_for_turns(stack, batch_id, 60)
    stack.postgres.restart()
    back = time.monotonic()
    took = wait_for_the_end(stack, studio, batch_id, back)
    assert_every_episode_played_once(stack, studio, endpoint, batch_id, in_flight=8)
    assert all(studio.alive().values()), studio.logs()
    print(f"PostgreSQL restart: over {took:.1f} s after; {_retries(studio)} retries; ", end="")
    print(f"{endpoint.repeated()} of {len(endpoint.requests)} requests repeated")


def test_it_finishes_every_episode_of_a_batch_across_30_s_without_postgresql(
    stack: Stack, studio: Processes, endpoint: Endpoint
):
    # `rollout --wait` follows the batch through it, saying so in one line.
    before = _last_batch(stack)
    follower = studio.start("rollout-wait", *_rollout(stack, endpoint, "--wait"))
    deadline = time.monotonic() + 60
    while (batch_id := _last_batch(stack)) == before:
        assert time.monotonic() < deadline, studio.logs()
        time.sleep(0.2)
    wait_for_turns(stack, batch_id, 60)
    stack.postgres.stop()
    time.sleep(30)
    stack.postgres.start()
    back = time.monotonic()
    took = wait_for_the_end(stack, studio, batch_id, back)
    assert_every_episode_played_once(stack, studio, endpoint, batch_id, in_flight=8)
    assert all(studio.alive().values()), studio.logs()
    assert follower.wait(timeout=30) == 0, studio.log("rollout-wait")
    said = (studio.root / "rollout-wait.log").read_text()
    assert "Traceback" not in said, said
    assert "the database is unreachable" in said and "the database is back" in said, said
    summary = json.loads(said.strip().splitlines()[-1])
    assert (summary["finished"], summary["failed"]) == (SEEDS, 0), said
    print(f"PostgreSQL down 30 s: over {took:.1f} s after; {_retries(studio)} retries; ", end="")
    print(f"{endpoint.repeated()} of {len(endpoint.requests)} requests repeated")


def test_it_finishes_every_episode_of_a_batch_across_a_redis_restart(
    stack: Stack, studio: Processes, endpoint: Endpoint
):
    # A worker holding retries' countdowns while it waits for work (a training submission's,
    # as when one worker exited over it): on the lost connection kombu tried to put them
    # back through a connection already closed, and the worker died of it.
    holder = studio.worker_on("holder", queue="faults-held")
    deadline = time.monotonic() + 60
    while "ready." not in (studio.root / "holder.log").read_text():
        assert time.monotonic() < deadline and holder.poll() is None, studio.log("holder")
        time.sleep(0.2)
    from studio.celery import app

    with app.connection_for_write(url=stack.redis.url) as connection:
        for _ in range(2):
            app.send_task(
                "training.tasks.training_job_submit",
                args=[10**9],
                countdown=300,
                queue="faults-held",
                connection=connection,
            )
    while studio.log("holder").count("training_job_submit[") < 2:  # received, held
        assert time.monotonic() < deadline, studio.log("holder")
        time.sleep(0.2)
    batch_id = batch_start(stack, endpoint)
    wait_for_turns(stack, batch_id, 60)
    # Episodes are running, others wait in the queue: a restart without persistence loses
    # those messages, and every connection the workers hold.
    stack.redis.restart()
    back = time.monotonic()
    took = wait_for_the_end(stack, studio, batch_id, back)
    assert_every_episode_played_once(stack, studio, endpoint, batch_id, in_flight=8)
    assert all(studio.alive().values()), studio.logs()
    print(f"Redis restart: over {took:.1f} s after; {_retries(studio)} retries; ", end="")
    print(f"{endpoint.repeated()} of {len(endpoint.requests)} requests repeated")


def test_messages_taken_while_postgresql_is_down_are_tried_again_not_dropped(
    stack: Stack, endpoint: Endpoint, request
):
    """The workers start while PostgreSQL is down and take every message of a batch, each
    failing at its claim: each goes back to the broker with a countdown (it was acknowledged
    as done and the batch waited up to an hour for the requeue), and the batch plays once the
    database is back."""
    batch_id = batch_start(stack, endpoint)  # its messages wait in the queue: no worker yet
    stack.postgres.stop()
    folder = stack.root / request.node.name
    folder.mkdir()
    with processes(folder, stack.env) as studio:
        studio.worker("faults1", threads=4)
        studio.worker("faults2", threads=4)
        studio.scheduler()
        time.sleep(30)
        tried = _retries(studio)
        stack.postgres.start()
        back = time.monotonic()
        took = wait_for_the_end(stack, studio, batch_id, back)
        assert_every_episode_played_once(stack, studio, endpoint, batch_id, in_flight=0)
        assert all(studio.alive().values()), studio.logs()
    # Every message was taken and tried again while the database was down.
    assert tried >= SEEDS, (tried, studio.logs())
    print(f"PostgreSQL down before the claims: over {took:.1f} s after; {tried} retries")
