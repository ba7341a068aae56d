"""Probe sets and runs at scale: 10,000 questions made, then asked at concurrency 64, with the
workers' CPU per question against the rollout benchmark's CPU per call in the same run.

Scripted episodes are recorded first (untimed); `probe_set_create` then makes a set of at
least `--questions` questions from them (timed: wall and CPU of this process). A local
chat-completions server (a process of its own, one asyncio loop, as `vlm_concurrency`'s)
answers every request after 200 ms: with a text choice ("A") when the request offers no
tool (a probe question), with a call of the game's tool otherwise (a rollout turn). On the
same 4 Celery worker processes of 16 threads (`--workers`, `--threads`), through the same
Redis and PostgreSQL:

- the rollout side: `vlm_concurrency`'s batch, 64 episodes x 5 turns at concurrency 64, best
  of `--repeat` runs, each on seeds of its own; its `cpu_per_call_ms`;
- the probe side: one run of the whole set at concurrency 64 (chunks of 64 questions, one
  Celery task each); `cpu_per_question_ms`, the elapsed time against the ideal (questions x
  0.2 s / 64), and every request counted at the server.

`cpu_per_question_ms` / `cpu_per_call_ms` is `cpu_ratio_to_rollout_call`: what a question
costs a worker (frame read, request built, answer read, one transaction) against what a
rollout turn costs it (the game step, frame drawn and stored, request, answer, rows).

    python benchmarks/probe_throughput.py [--questions 10000] [--concurrency 64]
        [--workers 4] [--threads 16] [--repeat 3]

Reads BENCH_DATABASE (default `studio_bench_probes`, created and migrated here) and
CELERY_BROKER_URL (default redis://127.0.0.1:6379/0). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import bench_database  # noqa: E402

QUESTIONS = 10_000
CONCURRENCY = 64
WORKERS = 4
DELAY = 0.2
EPISODE_STEPS = 100
# Questions a recorded frame gives with every kind (measured: 30-34): how many episodes to
# record for the set asked for, with a margin.
QUESTIONS_PER_FRAME = 32
ROLLOUT_EPISODES = 64
ROLLOUT_TURNS = 5
WARM_UP_RUN = 1000
ENDED = ("done", "failed")


def serve_chat(conn, delay: float) -> None:
    """`vlm_concurrency.serve_chat`'s server, answering a request without tools with text."""
    import asyncio

    from rollouts.tests.openai_server import completion_body, text, tool_call

    state = {"requests": 0, "probe_requests": 0, "in_flight": 0, "max_in_flight": 0}
    script = ("move_right", "move_down", "move_left", "move_up", "do")

    def respond(writer, status: str, body: bytes) -> None:
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )

    async def handle(reader, writer) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                fields = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
                length = int({k.strip().lower(): v for k, v in fields.items()}["content-length"])
                body = json.loads(await reader.readexactly(length))
                state["requests"] += 1
                number = state["requests"]
                state["in_flight"] += 1
                state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
                await asyncio.sleep(delay)
                if body.get("tools"):
                    reply = tool_call(script[number % len(script)])
                else:
                    state["probe_requests"] += 1
                    reply = text("A")
                answer = completion_body(reply, number=number, model=str(body.get("model", "")))
                state["in_flight"] -= 1
                respond(writer, "200 OK", json.dumps(answer).encode())
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        conn.send(f"http://127.0.0.1:{port}/v1")
        loop = asyncio.get_running_loop()
        while (command := await loop.run_in_executor(None, conn.recv)) != "stop":
            if command == "reset":
                state["max_in_flight"] = state["in_flight"]
            conn.send((state["requests"], state["probe_requests"], state["max_in_flight"]))
        server.close()

    asyncio.run(main())


class Endpoint:
    def __init__(self, *, delay: float) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=serve_chat, args=(child, delay), daemon=True)
        self._process.start()
        self.pid = self._process.pid
        self.url = self._conn.recv()

    def counts(self, *, reset: bool = False) -> tuple[int, int, int]:
        """(requests so far, of them probe questions, most in flight since the last reset)."""
        self._conn.send("reset" if reset else "count")
        return self._conn.recv()

    def stop(self) -> None:
        self._conn.send("stop")
        self._process.join(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=QUESTIONS)
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY)
    parser.add_argument("--workers", type=int, default=WORKERS)
    parser.add_argument("--threads", type=int, default=0, help="default: concurrency/workers")
    parser.add_argument("--repeat", type=int, default=3, help="rollout runs; the best counts")
    args = parser.parse_args()
    workers_n = max(1, args.workers)
    threads = args.threads or max(1, -(-args.concurrency // workers_n))

    database = bench_database("studio_bench_probes")
    base = os.environ.get("BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432")
    database_url = f"{base}/{database}"
    broker_url = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")
    scratch = Path(tempfile.mkdtemp(prefix="probe-bench-"))
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "CELERY_BROKER_URL": broker_url,
        "SECRET_KEY": os.environ.get("SECRET_KEY", "bench-only"),
        "STUDIO_MEDIA_ROOT": str(scratch / "media"),
        "DJANGO_SETTINGS_MODULE": "studio.settings",
        "OPENAI_API_KEY": "",
    }
    os.environ.update(env)

    from benchmarks import vlm_concurrency as vlm

    vlm.ensure_database(database_url)
    import django

    django.setup()
    from django.core.management import call_command

    from probes import runs
    from probes.models import ProbeRun
    from probes.services import probe_set_create
    from rollouts.recording import services as recording
    from rollouts.review.turn_selection import TurnSelection
    from rollouts.rollout_settings import RolloutSettings
    from studio.celery import app
    from studio.models import Endpoint as EndpointRow

    call_command("migrate", verbosity=0)
    app.conf.task_default_queue = vlm.QUEUE
    django.conf.settings.STUDIO_MODEL_QUEUE = vlm.QUEUE  # where probe chunks are sent
    app.control.purge()

    # The frames the set is made of: scripted episodes, recorded here, untimed.
    episodes = math.ceil(args.questions / QUESTIONS_PER_FRAME / (EPISODE_STEPS + 1))
    started = time.monotonic()
    frames_batch = recording.batch_run_inline(
        settings=RolloutSettings(
            policy="scripted",
            seeds=tuple(range(5000, 5000 + episodes)),
            steps=EPISODE_STEPS,
            name="probe bench frames",
        )
    )
    record_s = time.monotonic() - started
    print(f"probe_throughput: {episodes} episodes recorded", file=sys.stderr, flush=True)

    # The set, timed; cut to the questions asked for (per_episode frames of each episode).
    selection = TurnSelection(batches=(frames_batch.id,))
    per_episode = math.ceil(args.questions / QUESTIONS_PER_FRAME / episodes)
    while True:
        cpu, wall = time.process_time(), time.monotonic()
        probe_set = probe_set_create(
            filters=selection, seed=1, per_episode=per_episode, name="probe bench"
        )
        set_wall, set_cpu = time.monotonic() - wall, time.process_time() - cpu
        if probe_set.questions_count >= args.questions or per_episode > EPISODE_STEPS:
            break
        per_episode += max(1, per_episode // 10)
    questions = probe_set.questions_count
    print(f"probe_throughput: a set of {questions} questions", file=sys.stderr, flush=True)

    server = Endpoint(delay=DELAY)
    EndpointRow.objects.update_or_create(
        name="probe-bench",
        defaults={"base_url": server.url, "api_key_env": "", "concurrency": args.concurrency},
    )

    def rollout_settings(name: str, seeds: range, steps: int) -> RolloutSettings:
        return RolloutSettings(
            policy="openai",
            model="bench-vlm",
            base_url=server.url,
            seeds=tuple(seeds),
            steps=steps,
            concurrency=args.concurrency,
            name=name,
        )

    def seeds(run: int) -> range:
        return range(run * ROLLOUT_EPISODES, (run + 1) * ROLLOUT_EPISODES)

    workers = vlm.start_workers(env, scratch, workers=workers_n, threads=threads)
    pids = [w.pid for w in workers]
    rollout_runs = []
    try:
        vlm.wait_for_workers(app, workers)
        vlm.run_batch(rollout_settings("probe bench warm-up", seeds(WARM_UP_RUN), 1))
        print("probe_throughput: warmed up, rollout runs", file=sys.stderr, flush=True)
        for run in range(max(1, args.repeat)):
            before, _, _ = server.counts(reset=True)
            cpu_before = vlm.cpu_seconds(pids)
            elapsed, batch = vlm.run_batch(
                rollout_settings("probe bench rollout", seeds(run), ROLLOUT_TURNS),
                earliest=ROLLOUT_TURNS * DELAY,
            )
            cpu = sum(vlm.cpu_seconds(pids)) - sum(cpu_before)
            after, _, in_flight = server.counts()
            rollout_runs.append((elapsed, batch, cpu, after - before, in_flight))

        print("probe_throughput: the probe run", file=sys.stderr, flush=True)
        before, probe_before, _ = server.counts(reset=True)
        cpu_before = vlm.cpu_seconds(pids)
        endpoint_before = vlm.cpu_seconds([server.pid])[0]
        servers_before = vlm.server_cpu_seconds()
        started = time.monotonic()
        run = runs.probe_run_create(
            probe_set=probe_set,
            endpoint_name="probe-bench",
            model="bench-vlm",
            concurrency=args.concurrency,
        )
        enqueue_s = time.monotonic() - started
        time.sleep(questions * DELAY / args.concurrency)  # no end can come sooner
        status = ProbeRun.objects.values_list("status", flat=True)
        while status.get(id=run.id) not in ENDED and time.monotonic() - started < 3600:
            time.sleep(0.05)
        probe_elapsed = time.monotonic() - started
        probe_cpu_each = [a - b for a, b in zip(vlm.cpu_seconds(pids), cpu_before, strict=True)]
        servers = vlm.server_cpu_delta(servers_before, vlm.server_cpu_seconds())
        endpoint_cpu = vlm.cpu_seconds([server.pid])[0] - endpoint_before
        after, probe_after, probe_in_flight = server.counts()
    finally:
        vlm.stop_workers(workers)
        server.stop()

    run.refresh_from_db()
    probe_cpu = sum(probe_cpu_each)
    elapsed, batch, cpu, calls, in_flight = min(rollout_runs, key=lambda r: r[0])
    cpu_per_call = 1000 * cpu / max(calls, 1)
    cpu_per_question = 1000 * probe_cpu / max(run.model_calls, 1)
    ideal = questions * DELAY / args.concurrency
    result = {
        "benchmark": "probe_throughput",
        "workers": workers_n,
        "threads_per_worker": threads,
        "server_delay_s": DELAY,
        "concurrency": args.concurrency,
        "set": {
            "questions": questions,
            "frames": probe_set.frames_count,
            "episodes": probe_set.episodes_count,
            "per_episode": probe_set.per_episode,
            "create_s": round(set_wall, 3),
            "create_cpu_s": round(set_cpu, 3),
            "questions_per_s": round(questions / set_wall, 1),
            "frames_recorded_s": round(record_s, 2),
        },
        "probe_run": {
            "status": run.status,
            "error": run.error[:200],
            "questions": run.questions_total,
            "answered": run.answered,
            "errors": run.errors,
            "correct": run.correct,
            "model_calls": run.model_calls,
            "requests_at_server": after - before,
            "probe_requests_at_server": probe_after - probe_before,
            "max_in_flight": probe_in_flight,
            "chunks": run.chunks.count(),
            "enqueue_s": round(enqueue_s, 3),
            "elapsed_s": round(probe_elapsed, 2),
            "ideal_s": round(ideal, 2),
            "ratio_to_ideal": round(ideal / probe_elapsed, 3),
            "questions_per_s": round(run.answered / probe_elapsed, 1),
            "worker_cpu_s": round(probe_cpu, 2),
            "worker_cpu_each_s": [round(c, 2) for c in probe_cpu_each],
            "cpu_per_question_ms": round(cpu_per_question, 2),
            "endpoint_cpu_per_question_ms": round(1000 * endpoint_cpu / max(questions, 1), 2),
            **{
                f"{kind}_cpu_per_question_ms": None
                if value is None
                else round(1000 * value / max(questions, 1), 2)
                for kind, value in servers.items()
            },
        },
        "rollout": {
            "episodes": ROLLOUT_EPISODES,
            "turns_per_episode": ROLLOUT_TURNS,
            "batch_status": batch.status,
            "model_calls": calls,
            "recorded_model_calls": batch.model_calls,
            "max_in_flight": in_flight,
            "elapsed_s": round(elapsed, 3),
            "elapsed_runs_s": [round(r[0], 3) for r in rollout_runs],
            "cpu_per_call_ms": round(cpu_per_call, 2),
            "cpu_per_call_runs_ms": [round(1000 * r[2] / max(r[3], 1), 2) for r in rollout_runs],
        },
        "cpu_ratio_to_rollout_call": round(cpu_per_question / cpu_per_call, 3),
        "host_cpus": os.cpu_count(),
        "host_load_1m": round(os.getloadavg()[0], 2),
    }
    shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
