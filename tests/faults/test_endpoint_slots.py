"""A model endpoint's concurrency slots, and the episodes that hold them, through a killed
worker and a stopped Redis, at the default settings (`--concurrency 4`, the default lease).

A studio of the test's own (`tests.faults.stack`, set up as in `test_outages`): one worker of
4 threads plays a batch of 4 episodes, so its requests hold every slot of the endpoint.

* The worker is killed (SIGKILL) while every slot is held by a request, and started again
  under the same name: it takes the episodes over at once, and their first request reaches
  the endpoint once the dead worker's slot leases run out (10 s), not after its requests'
  timeout.
* Redis is stopped for 25 s (long enough for several lease lengths and claim renewals, short
  enough for the test to stay well under two minutes): the running episodes wait for it
  without handing their claims back, and go on from the turn they were at; no turn is asked
  twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.faults import test_outages
from tests.faults.stack import ROOT, Processes, postgres_bin, processes
from tests.faults.test_outages import Endpoint, Stack, episodes, turns_written

# `test_outages`'s module-scoped studio: one of this module's own, made and destroyed with it.
outages_stack = test_outages.stack

pytestmark = pytest.mark.skipif(
    postgres_bin() is None, reason="needs a PostgreSQL server under /usr/lib/postgresql"
)

SEEDS = 4  # one per thread of the one worker: every episode runs, each holding a slot


def batch_start(stack: Stack, endpoint: Endpoint, *, steps: int) -> int:
    """A model batch at the default `--concurrency` (4)."""
    done = subprocess.run(
        [
            sys.executable, "manage.py", "rollout", "--policy", "openai",
            "--model", "slots-model", "--base-url", endpoint.url,
            "--seeds", f"0-{SEEDS - 1}", "--steps", str(steps), "--history-frames", "1",
        ],
        cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])["batch_id"]


def claims(stack: Stack, batch_id: int) -> list[tuple]:
    """(seed, status, claim token, worker) of each episode."""
    return stack.postgres.rows(
        "SELECT seed, status, claim_token, worker FROM rollouts_episode"
        " WHERE batch_id = %s ORDER BY seed",
        batch_id,
    )


def wait_until(condition, *, timeout: float, what: str, studio: Processes) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}\n{studio.logs()}"
        time.sleep(0.1)


def wait_for_the_end(stack: Stack, studio: Processes, batch_id: int, *, timeout: float) -> None:
    ended = ("finished", "failed", "canceled")
    wait_until(
        lambda: all(row[1] in ended for row in episodes(stack, batch_id)),
        timeout=timeout,
        what=f"batch {batch_id} did not end: {episodes(stack, batch_id)}",
        studio=studio,
    )


def assert_finished_once(stack: Stack, studio: Processes, batch_id: int, steps: int) -> None:
    rows = episodes(stack, batch_id)
    detail = f"{rows}\n{studio.logs()}"
    assert [row[0] for row in rows] == list(range(SEEDS)), detail
    for _seed, status, played, turns, distinct, last, error in rows:
        assert (status, played, turns, distinct, last, error) == (
            "finished", steps, steps, steps, steps - 1, ""
        ), detail  # fmt: skip


@pytest.fixture
def endpoint(request) -> Iterator[Endpoint]:
    server = Endpoint()
    server.delay = request.param
    server.start()
    yield server
    server.stop()


@pytest.mark.parametrize("endpoint", [2.0], indirect=True)
def test_a_killed_workers_slots_free_its_endpoint_within_seconds(
    outages_stack: Stack, endpoint: Endpoint, request
):
    stack = outages_stack
    steps = 6
    folder = stack.root / request.node.name
    folder.mkdir()
    with processes(folder, stack.env) as studio:
        worker = studio.worker("slots1", threads=4)
        batch_id = batch_start(stack, endpoint, steps=steps)
        # Every slot held by a request of the worker, each answered in 2 s.
        wait_until(
            lambda: endpoint.in_flight == SEEDS and turns_written(stack, batch_id) >= SEEDS,
            timeout=90,
            what="the worker never held every slot",
            studio=studio,
        )
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        killed = time.monotonic()
        sent_before = len(endpoint.requests)
        studio.worker("slots1", threads=4)  # the same name: it takes the episodes over
        wait_until(
            lambda: len(endpoint.requests) > sent_before,
            timeout=60,
            what="no request reached the endpoint after the restart",
            studio=studio,
        )
        first = endpoint.requests[sent_before].at - killed
        # The dead worker's leases ran out 10 s after their last renewal at most (it held
        # them for the request timeout plus 30 s: 90 s).
        assert first < 20, first
        wait_for_the_end(stack, studio, batch_id, timeout=90)
        assert_finished_once(stack, studio, batch_id, steps)
    print(f"first request {first:.1f} s after the kill; ", end="")


@pytest.mark.parametrize("endpoint", [0.25], indirect=True)
def test_running_episodes_wait_out_a_redis_stop_and_go_on_where_they_were(
    outages_stack: Stack, endpoint: Endpoint, request
):
    stack = outages_stack
    steps = 40
    stop_seconds = 25
    folder = stack.root / request.node.name
    folder.mkdir()
    with processes(folder, stack.env) as studio:
        studio.worker("slots2", threads=4)
        batch_id = batch_start(stack, endpoint, steps=steps)
        wait_until(
            lambda: turns_written(stack, batch_id) >= 30,
            timeout=90,
            what="the batch never got under way",
            studio=studio,
        )
        held = claims(stack, batch_id)
        assert {row[1] for row in held} == {"running"}, held
        stack.redis.stop()
        stopped = time.monotonic()
        time.sleep(stop_seconds / 2)
        sent_meanwhile = len(endpoint.requests)
        time.sleep(stop_seconds / 2)
        # No request without the limiter, and every claim still held by the same worker
        # (renewed in PostgreSQL all along): nothing handed back.
        assert len(endpoint.requests) == sent_meanwhile, "requests sent without the limiter"
        assert claims(stack, batch_id) == held, studio.logs()
        stack.redis.start()
        back = time.monotonic()
        wait_for_the_end(stack, studio, batch_id, timeout=90)
        took = time.monotonic() - back
        resumed = min(r.at for r in endpoint.requests[sent_meanwhile:]) - back
        assert resumed < 5, resumed  # a waiting request tries Redis again every second
        assert_finished_once(stack, studio, batch_id, steps)
        # One request per turn: the calls in flight when Redis went were recorded, not asked
        # again, and each episode went on from the turn it was at.
        assert len(endpoint.requests) == SEEDS * steps, len(endpoint.requests)
        log = (folder / "slots2.log").read_text(errors="replace")
        assert "handed back" not in log, log
        assert not [line for line in log.splitlines() if "episode_run[" in line and "Retry" in line]
        assert all(studio.alive().values()), studio.logs()
    print(f"Redis away {back - stopped:.0f} s: requests again {resumed:.1f} s after, ", end="")
    print(f"the batch over {took:.1f} s after; ", end="")
