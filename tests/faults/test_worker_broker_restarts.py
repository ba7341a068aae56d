"""A worker outlives every broker restart: ten Redis restarts in a row under a model batch, and
every worker process is the one that started, the batch finishing with every episode.

Each restart closes the workers' channels while their episodes hold messages; a task that
ends after it (its retry not sent while Redis was down) acknowledges or rejects its message
on the closed channel, and kombu ended the worker over it ("Unrecoverable error") about one
restart in two. The studio of `test_outages` (its own PostgreSQL and Redis, two workers of 4
threads and the scheduler, at the default settings) and its endpoint, a longer batch.

And the scheduler's periodic tasks say a PostgreSQL stop in one line per run, not a traceback.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.faults import test_outages as outages
from tests.faults.stack import ROOT, Processes, RedisServer, processes

pytestmark = outages.pytestmark

# This module's own cluster and Redis, and a fresh endpoint per test, as `test_outages` has.
stack = outages.stack
endpoint = outages.endpoint

RESTARTS = 10
WORKERS = ("restarts1", "restarts2")
# Long enough for every restart to fall while episodes run.
STEPS = 120


@pytest.fixture
def studio(stack: outages.Stack, request) -> Iterator[Processes]:
    folder = stack.root / request.node.name
    folder.mkdir()
    with processes(folder, stack.env) as running:
        for name in WORKERS:
            running.worker(name, threads=4)
        running.scheduler()
        yield running


def _batch_start(stack: outages.Stack, endpoint: outages.Endpoint) -> int:
    command = outages._rollout(stack, endpoint)
    command[command.index("--steps") + 1] = str(STEPS)
    done = subprocess.run(
        [sys.executable, *command],
        cwd=ROOT,
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])["batch_id"]


def _died(studio: Processes) -> list[str]:
    """The workers that met an error that ends them (they go on a while with their tasks)."""
    return [
        name
        for name in WORKERS
        if "Unrecoverable error" in (studio.root / f"{name}.log").read_text(errors="replace")
    ]


def _connections(studio: Processes, name: str) -> int:
    """How many times the worker has connected to the broker (its first time included)."""
    return (studio.root / f"{name}.log").read_text(errors="replace").count("Connected to redis")


def test_every_worker_outlives_ten_redis_restarts_in_a_row_and_the_batch_ends(
    stack: outages.Stack, studio: Processes, endpoint: outages.Endpoint
):
    pids = {name: studio.children[name].pid for name in WORKERS}
    batch_id = _batch_start(stack, endpoint)
    outages.wait_for_turns(stack, batch_id, 60)
    for restart in range(1, RESTARTS + 1):
        stack.redis.restart()
        # Until each worker has connected again, and a little past it: the worker died about
        # a second after reconnecting, when the work of its closed channel ended.
        deadline = time.monotonic() + 90
        while any(_connections(studio, name) <= restart for name in WORKERS):
            assert time.monotonic() < deadline, f"restart {restart}:\n{studio.logs()}"
            assert all(studio.alive().values()), f"restart {restart}:\n{studio.logs()}"
            assert not _died(studio), f"restart {restart}:\n{studio.logs()}"
            time.sleep(0.2)
        time.sleep(1.5)
        assert not _died(studio), f"restart {restart}:\n{studio.logs()}"
    back = time.monotonic()
    took = outages.wait_for_the_end(stack, studio, batch_id, back)
    rows = outages.episodes(stack, batch_id)
    detail = f"\n{outages._table(rows)}\n{studio.logs()}"
    assert {row[1] for row in rows} == {"finished"}, detail
    assert len(rows) == outages.SEEDS, detail
    for seed, _status, steps, turns, distinct, last, _error in rows:
        assert (steps, turns, distinct, last) == (STEPS, STEPS, STEPS, STEPS - 1), (seed, detail)
    # Every request the endpoint received is counted on the batch.
    calls, retries = stack.postgres.rows(
        "SELECT model_calls, model_retries FROM rollouts_rolloutbatch WHERE id = %s", batch_id
    )[0]
    assert calls + retries == len(endpoint.requests), (calls, retries, len(endpoint.requests))
    # The very processes that started: none died and was replaced.
    assert all(studio.alive().values()), studio.logs()
    assert {name: studio.children[name].pid for name in WORKERS} == pids
    assert _died(studio) == [], studio.logs(200)
    print(
        f"{RESTARTS} Redis restarts: over {took:.1f} s after the last; "
        f"{len(endpoint.requests)} requests for {outages.SEEDS * STEPS} turns"
    )


@pytest.mark.parametrize("left_by", ["channel closed", "connection closed"])
def test_work_of_a_channel_without_connection_ends_without_an_error_that_ends_a_worker(
    tmp_path, left_by: str
):
    """Each way the work of a closed channel ends, on each state a lost connection leaves the
    channel in (kombu's close: the channel's `connection` None, or its transport's `client`):
    an acknowledgement, a reject, a requeue or a recover is left to the broker; any other
    command is a lost connection (redis-py's ConnectionError, one of the transport's
    `connection_errors`), never AttributeError."""
    import redis.exceptions
    from kombu import Connection, Exchange, Queue

    import studio.celery  # noqa: F401 (its workarounds, as a worker has them)

    server = RedisServer(tmp_path / "redis")
    server.start()
    said: dict[str, str] = {}
    try:
        for action in ("ack", "reject", "requeue", "recover", "restore_visible", "put"):
            connection = Connection(server.url)
            channel = connection.channel()
            queue = Queue("closed", Exchange("closed"), routing_key="closed", channel=channel)
            queue.declare()
            with Connection(server.url) as publisher:
                publisher.Producer().publish({}, exchange="closed", routing_key="closed")
            message = queue.get(no_ack=False)
            # What kombu leaves once the connection is lost: no pool, and no connection.
            channel._disconnect_pools()
            if left_by == "channel closed":
                channel.connection = None
            else:
                connection.transport.client = None
            try:
                if action == "ack":
                    message.ack()
                elif action in ("reject", "requeue"):
                    message.reject(requeue=action == "requeue")
                elif action == "recover":
                    channel.basic_recover(requeue=True)
                elif action == "restore_visible":
                    channel.qos.restore_visible()
                else:
                    channel._put("closed", {"body": "{}"})
                said[action] = "done"
            except redis.exceptions.ConnectionError:
                said[action] = "lost connection"
            # Now, not at the interpreter's exit (kombu's finalizer), when the log is closed.
            channel.qos.restore_unacked_once()
    finally:
        server.stop()
    assert said == {
        "ack": "done",
        "reject": "done",
        "requeue": "done",
        "recover": "done",
        "restore_visible": "lost connection",
        "put": "lost connection",
    }


def test_the_scheduler_s_tasks_say_a_postgresql_stop_in_one_line_each_run(
    stack: outages.Stack, request
):
    folder = stack.root / request.node.name
    folder.mkdir()
    # Beat's two entries every second, so a short stop sees several runs of each.
    env = {**stack.env, "STUDIO_REQUEUE_EVERY_SECONDS": "1", "STUDIO_TRAINING_POLL_SECONDS": "1"}
    said = {
        task: f"{task}: the database or the task queue is unreachable"
        for task in ("studio.tasks.jobs_requeue", "training.tasks.training_jobs_poll")
    }
    with processes(folder, env) as studio:
        studio.worker("periodic", threads=2)
        studio.scheduler()

        def log() -> str:
            return (folder / "periodic.log").read_text(errors="replace")

        deadline = time.monotonic() + 90
        while not all(f"{task}[" in log() and "succeeded" in log() for task in said):
            assert time.monotonic() < deadline, studio.logs()
            time.sleep(0.2)
        stack.postgres.stop()
        try:
            deadline = time.monotonic() + 60
            while not all(log().count(line) >= 2 for line in said.values()):
                assert time.monotonic() < deadline, studio.log("periodic", 120)
                time.sleep(0.2)
        finally:
            stack.postgres.start()
        assert "Traceback" not in log(), studio.log("periodic", 120)
        assert all(studio.alive().values()), studio.logs()
