"""A worker killed mid-batch: every request it sent is counted, and against an endpoint with
prices at most the call in flight is asked again.

A studio of the test's own (`tests.faults.test_outages`' stack: a PostgreSQL cluster and a
Redis, real workers and the scheduler at the default settings) plays a model batch against a
local chat endpoint that logs every request, with prices set on it as an admin does. Mid-batch
the worker playing every episode is sent SIGKILL; another takes its episodes over once their
claims go stale. After the batch: the batch counts (`model_calls + model_retries`) exactly the
requests the endpoint received, and no episode asked more than one of its turns twice.

The endpoint's answer is a function of the request alone, so a turn asked again after the
takeover sends the very same request: requests are told apart per episode (the body's `seed`)
and turn (its messages), and any repeat of one is a call paid twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from tests.faults import test_outages
from tests.faults.stack import ROOT, processes
from tests.faults.test_outages import Endpoint, Stack, turns_written

# The studio of the test's own, a fixture of this module too (one cluster for its tests).
stack = test_outages.stack

pytestmark = pytest.mark.skipif(
    not os.path.isdir("/usr/lib/postgresql"), reason="needs a PostgreSQL server"
)

SEEDS = 4
ENDED = ("finished", "failed", "canceled")


def _manage(stack: Stack, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _priced_endpoint(stack: Stack, name: str, url: str) -> None:
    """A chat endpoint with prices, as an admin sets them (the command sets none)."""
    _manage(stack, "endpoint", name, "--kind", "chat", "--base-url", url)
    stack.postgres.rows(
        "UPDATE studio_endpoint SET input_price_per_million = 0.15,"
        " output_price_per_million = 0.60 WHERE name = %s RETURNING id",
        name,
    )


def _batch(stack: Stack, batch_id: int) -> tuple[str, int, int]:
    return stack.postgres.rows(
        "SELECT status, model_calls, model_retries FROM rollouts_rolloutbatch WHERE id = %s",
        batch_id,
    )[0]


def _paid_twice(endpoint: Endpoint) -> dict[int, int]:
    """Per episode (the body's seed), the requests beyond one per distinct turn."""
    asked: Counter[tuple[int, str]] = Counter()
    for received in list(endpoint.requests):
        messages = json.dumps(received.body["messages"], sort_keys=True).encode()
        asked[(received.body["seed"], hashlib.sha256(messages).hexdigest())] += 1
    repeats: Counter[int] = Counter()
    for (seed, _turn), times in asked.items():
        repeats[seed] += times - 1
    return dict(repeats)


@pytest.mark.parametrize(
    ("call_seconds", "steps", "killed_after_turns"),
    [(0.05, 60, 4 * SEEDS), (1.0, 8, 2 * SEEDS)],
    ids=["50ms", "1s"],
)
def test_a_killed_workers_requests_are_all_counted_and_at_most_one_turn_asked_again(
    stack: Stack, request, call_seconds: float, steps: int, killed_after_turns: int
):
    endpoint = Endpoint()
    endpoint.delay = call_seconds
    endpoint.start()
    folder = stack.root / request.node.name
    folder.mkdir()
    name = f"priced-{request.node.callspec.id}"
    try:
        with processes(folder, stack.env) as studio:
            victim = studio.worker("victim", threads=8)
            studio.scheduler()
            _priced_endpoint(stack, name, endpoint.url)
            out = _manage(
                stack, "rollout", "--policy", "openai", "--model", "fault-model",
                "--endpoint", name, "--seeds", f"0-{SEEDS - 1}", "--steps", str(steps),
                "--history-frames", "1", "--concurrency", "16",
            )  # fmt: skip
            batch_id = json.loads(out.strip().splitlines()[-1])["batch_id"]
            deadline = time.monotonic() + 90
            while turns_written(stack, batch_id) < killed_after_turns:
                assert time.monotonic() < deadline, studio.logs()
                time.sleep(0.05)
            # Not right after a write (the count above moves when one lands): mid-way
            # between two, where turns decided and not yet written would be lost.
            time.sleep(0.6)
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait()
            studio.worker("heir", threads=8)
            deadline = time.monotonic() + 150
            while _batch(stack, batch_id)[0] not in ENDED:
                assert time.monotonic() < deadline, studio.logs()
                time.sleep(0.5)
            status, calls, retries = _batch(stack, batch_id)
            detail = studio.logs()
    finally:
        endpoint.stop()
    taken_over = stack.postgres.rows(
        "SELECT count(*) FROM rollouts_episode WHERE batch_id = %s AND lost_worker_at IS NOT NULL",
        batch_id,
    )[0][0]
    assert status == "finished", detail
    assert taken_over >= 1, detail  # the kill did leave episodes to take over
    paid_twice = _paid_twice(endpoint)
    assert all(times <= 1 for times in paid_twice.values()), paid_twice
    assert calls + retries == len(endpoint.requests), (calls, retries, len(endpoint.requests))
    print(f"{len(endpoint.requests)} requests, counted {calls} + {retries}; {paid_twice}")


def _probe_run(stack: Stack, run_id: int) -> tuple[str, int, int, int]:
    return stack.postgres.rows(
        "SELECT status, answered, model_calls, model_retries FROM probes_proberun WHERE id = %s",
        run_id,
    )[0]


def test_a_probe_run_whose_worker_is_killed_counts_every_request_it_sent(stack: Stack, request):
    endpoint = Endpoint()
    endpoint.delay = 0.3
    endpoint.start()
    folder = stack.root / request.node.name
    folder.mkdir()
    try:
        with processes(folder, stack.env) as studio:
            victim = studio.worker("victim", threads=4)
            studio.scheduler()
            played = _manage(
                stack, "rollout", "--policy", "random", "--seeds", "100-101", "--steps", "40",
                "--inline",
            )  # fmt: skip
            # Its questions on this batch's frames only (the module's other tests record too).
            batch = str(json.loads(played.strip().splitlines()[-1])["batch_id"])
            made = json.loads(
                _manage(stack, "probe_set", "--batch", batch, "--seed", "7", "--per-episode", "3")
                .strip()
                .splitlines()[-1]
            )
            _manage(stack, "endpoint", "probed", "--kind", "chat", "--base-url", endpoint.url)
            out = _manage(
                stack, "probe_run", str(made["set_id"]), "--endpoint", "probed", "--model",
                "fault-model", "--observation", "none", "--concurrency", "8",
            )  # fmt: skip
            run_id = json.loads(out.strip().splitlines()[-1])["run_id"]
            deadline = time.monotonic() + 90
            while _probe_run(stack, run_id)[1] < 4:
                assert time.monotonic() < deadline, studio.logs()
                time.sleep(0.05)
            # Mid-call: the answers land as the calls end, 0.3 s apart in each chunk.
            time.sleep(0.15)
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait()
            studio.worker("heir", threads=4)
            deadline = time.monotonic() + 150
            while _probe_run(stack, run_id)[0] not in ("done", "failed"):
                assert time.monotonic() < deadline, studio.logs()
                time.sleep(0.5)
            status, answered, calls, retries = _probe_run(stack, run_id)
            detail = studio.logs()
    finally:
        endpoint.stop()
    assert (status, answered) == ("done", made["questions"]), detail
    # A probe run's model_calls are its requests, retries among them.
    assert calls == len(endpoint.requests) > made["questions"], (calls, len(endpoint.requests))
    print(f"probe run: {len(endpoint.requests)} requests, counted {calls} ({retries} retries)")
