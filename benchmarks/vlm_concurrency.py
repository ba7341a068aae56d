"""How well the `openai` policy overlaps model calls: Celery workers vs the ideal and a loop.

A local chat-completions server answers every call after 200 ms. A batch of 64 episodes x 5
turns (one action per turn, so 320 calls) runs at batch `--concurrency 64` on real worker
processes (`celery -A studio worker --pool threads --concurrency N`; by default 4 of them,
16 threads each, the layout the README gives for a 2-core host), through Redis and
PostgreSQL. The ideal is
calls x 0.2 s / 64; the baseline is the same batch played one episode after another in one
process, as synth-ai's scripts did. Both sides are best of `--repeat` runs, each run on
seeds of its own (new frames, new image files, as a new batch writes them).

`cpu_per_call_ms` is the workers' own CPU time (user + system, all threads) over the calls
they made: what one call costs a worker, whatever the host's load. `endpoint_cpu_per_call_ms`
is the local server's, on the same cores; `postgres_cpu_per_call_ms` and
`redis_cpu_per_call_ms` those of the database and the broker, where they run on this host.

`--timeline` starts the workers with `benchmarks/vlm_trace.py`, which times each episode's
steps (task received, claim, world generation, each call, rows, end), and adds where the
last timed run's episodes waited (`timeline`: milestones and gaps, seconds, p50/p90/max).

    python benchmarks/vlm_concurrency.py [--repeat N] [--skip-sequential] [--timeline]
        [--episodes 64] [--turns 5] [--concurrency 64] [--workers 4] [--threads 16]

Reads DATABASE_URL (default: a `studio_bench` PostgreSQL database, created and migrated
here) and CELERY_BROKER_URL (default redis://127.0.0.1:6379/0). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EPISODES = 64
TURNS = 5
DELAY = 0.2
CONCURRENCY = 64
WORKERS = 4
TARGET_IDEAL = 0.7
TARGET_SEQUENTIAL = 10.0
SCRIPT = ("move_right", "move_down", "move_left", "move_up", "do")
# A queue of its own: other workers on the same broker never take the benchmark's episodes.
QUEUE = "vlm-bench"
# The warm-up batch's seeds are those of this run number (`seeds`), past any timed run's.
WARM_UP_RUN = 1000


def serve_chat(conn, delay: float) -> None:
    """The local endpoint, in a process of its own (see `Endpoint`): chat completions over
    HTTP/1.1 with keep-alive, each request read whole and parsed, answered `delay` seconds
    later with a call of the game's tool (`SCRIPT`, in turn), as a model server would.

    One asyncio loop, not a thread per connection: the endpoint shares the host's two cores
    with the workers, and the test suite's `ChatServer` (http.server, a thread a
    connection) spends about twice this one's CPU a call: CPU the ideal (calls x delay /
    concurrency) gives the workers, and the endpoint would take from them. What each run's
    endpoint used is in the output (`endpoint_cpu_per_call_ms`).
    """
    import asyncio

    from rollouts.tests.openai_server import completion_body, tool_call

    state = {"requests": 0, "in_flight": 0, "max_in_flight": 0}

    def answer(number: int, model: str) -> bytes:
        # The completion the test suite's `ChatServer` sends for the same reply.
        reply = tool_call(SCRIPT[number % len(SCRIPT)])
        return json.dumps(completion_body(reply, number=number, model=model)).encode()

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
                method, path, _ = lines[0].split(" ", 2)
                fields = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
                length = int({k.strip().lower(): v for k, v in fields.items()}["content-length"])
                body = json.loads(await reader.readexactly(length))
                if method != "POST" or not path.endswith("/chat/completions"):
                    respond(writer, "404 Not Found", b'{"error": {"message": "not found"}}')
                    continue
                if not isinstance(body, dict) or not body.get("messages"):
                    respond(writer, "400 Bad Request", b'{"error": {"message": "no messages"}}')
                    continue
                state["requests"] += 1
                number = state["requests"]
                state["in_flight"] += 1
                state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
                await asyncio.sleep(delay)
                reply = answer(number, str(body.get("model", "")))
                # Counted out before the answer leaves: the client may send its next request
                # the instant it has this one, and must not be seen overlapping.
                state["in_flight"] -= 1
                respond(writer, "200 OK", reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed its connection
        except asyncio.CancelledError:
            pass  # the harness said stop while a client still held its connection open
        finally:
            writer.close()

    async def main() -> None:
        # (asyncio sets TCP_NODELAY on each connection: no answer waits for an ACK.)
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        conn.send(f"http://127.0.0.1:{port}/v1")
        loop = asyncio.get_running_loop()
        # The harness's commands, read on a thread of their own: the counters are plain ints.
        while (command := await loop.run_in_executor(None, conn.recv)) != "stop":
            if command == "reset":
                state["max_in_flight"] = state["in_flight"]
            conn.send((state["requests"], state["max_in_flight"]))
        server.close()

    asyncio.run(main())


class Endpoint:
    """The chat server in its own process, as a model server is: in this one, its request
    threads would share a GIL with the code that creates the batch and sends its tasks."""

    def __init__(self, *, delay: float) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=serve_chat, args=(child, delay), daemon=True)
        self._process.start()
        self.pid = self._process.pid
        self.url = self._conn.recv()

    def counts(self, *, reset: bool = False) -> tuple[int, int]:
        """(requests received so far, most in flight at once since the last reset)."""
        self._conn.send("reset" if reset else "count")
        return self._conn.recv()

    def stop(self) -> None:
        self._conn.send("stop")
        self._process.join(timeout=10)


def ensure_database(url: str) -> None:
    import psycopg

    parsed = urlparse(url)
    name = parsed.path.lstrip("/")
    admin = parsed._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def start_workers(
    env: dict[str, str], logs: Path, *, workers: int, threads: int, app: str = "studio"
) -> list[subprocess.Popen]:
    celery = str(Path(sys.executable).with_name("celery"))
    started = []
    for i in range(workers):
        log = open(logs / f"worker{i}.log", "w")  # noqa: SIM115  closed with the process
        started.append(
            subprocess.Popen(
                [
                    *([celery] if Path(celery).exists() else [sys.executable, "-m", "celery"]),
                    "-A",
                    app,
                    "worker",
                    "--pool",
                    "threads",
                    "--concurrency",
                    str(threads),
                    "-n",
                    f"vlm-bench-{i}@%h",
                    "--loglevel",
                    "WARNING",
                    "--without-gossip",
                    "--without-mingle",
                    "-Q",
                    QUEUE,
                ],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
    return started


def stop_workers(workers: list[subprocess.Popen]) -> None:
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def wait_for_workers(app, workers: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any(w.poll() is not None for w in workers):
            raise RuntimeError("a worker exited while starting")
        names = {name for reply in app.control.ping(timeout=0.5) for name in reply}
        if sum(name.startswith("vlm-bench-") for name in names) >= len(workers):
            return
    raise RuntimeError("workers did not answer a ping within 60 s")


def cpu_seconds(pids: list[int]) -> list[float]:
    """User + system CPU time of each process so far, all its threads (Linux; 0 if unknown)."""
    times = []
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            times.append(0.0)
            continue
        times.append((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    return times


def server_cpu_seconds() -> dict[str, dict[int, float]]:
    """CPU time so far of the PostgreSQL and Redis server processes on this host, by pid
    (Linux; empty where /proc shows none, as for servers on other hosts)."""
    found: dict[str, dict[int, float]] = {"postgres": {}, "redis": {}}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        # A server process renames itself ("postgres: ...", "redis-server host:port").
        program = os.path.basename(command.split(b" ")[0]).rstrip(b":")
        kind = {b"postgres": "postgres", b"redis-server": "redis"}.get(program)
        if kind is not None:
            found[kind][int(entry.name)] = cpu_seconds([int(entry.name)])[0]
    return found


def server_cpu_delta(before: dict, after: dict) -> dict[str, float | None]:
    """Each server's CPU between two `server_cpu_seconds`: its processes alive at both (a
    connection opened or closed between them is missed); None where none was seen."""
    return {
        kind: round(
            sum(cpu - before[kind][pid] for pid, cpu in procs.items() if pid in before[kind]), 3
        )
        if procs
        else None
        for kind, procs in after.items()
    }


def run_batch(settings, *, earliest: float = 0.0, timeout: float = 600) -> tuple[float, object]:
    """Create the batch and wait for its end: (seconds from the call, the batch as it ended).

    `earliest`: no end can come sooner (each episode's calls one after another, `delay`
    each): the status is polled from then on, every 5 ms, which sees the end sooner, and
    for fewer polls, than a coarser poll from the start.
    """
    from django.db import connection

    from rollouts.models import RolloutBatch
    from rollouts.recording import services

    started = time.monotonic()
    batch = services.batch_create(settings=settings)
    batch.enqueue_s = time.monotonic() - started  # rows written and every task sent
    batch.wall_start = time.time() - batch.enqueue_s
    ended = (RolloutBatch.Status.FINISHED, RolloutBatch.Status.FAILED)
    table = RolloutBatch._meta.db_table
    time.sleep(max(0.0, earliest - (time.monotonic() - started)))
    while time.monotonic() - started < timeout:
        # Only the status, in plain SQL: this process shares the cores with the workers, and
        # reading the whole row, or the ORM's query for the status alone, costs more CPU.
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT status FROM {table} WHERE id = %s", [batch.id])
            (status,) = cursor.fetchone()
        if status in ended:
            elapsed = time.monotonic() - started
            batch.refresh_from_db()
            return elapsed, batch
        time.sleep(0.005)
    raise RuntimeError(f"batch {batch.id} did not end within {timeout} s")


def run_sequential(settings) -> tuple[float, object]:
    from rollouts.recording import services

    started = time.monotonic()
    batch = services.batch_run_inline(settings=settings, workers=1)
    return time.monotonic() - started, batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-sequential", action="store_true")
    parser.add_argument(
        "--priced",
        action="store_true",
        help="through a named endpoint with prices (every turn written as soon as decided)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs of each side; the best counts")
    parser.add_argument("--episodes", type=int, default=EPISODES)
    parser.add_argument("--turns", type=int, default=TURNS, help="turns (model calls) per episode")
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY, help="the batch's")
    parser.add_argument("--workers", type=int, default=WORKERS, help="worker processes")
    parser.add_argument(
        "--threads", type=int, default=0, help="threads per worker (default: concurrency/workers)"
    )
    parser.add_argument("--history-frames", type=int, default=0, help="frames of history per call")
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="time each episode's steps in the workers (benchmarks/vlm_trace.py) and report "
        "where the last timed run waited",
    )
    args = parser.parse_args()
    workers_n = max(1, args.workers)
    repeat = max(1, args.repeat)
    threads = args.threads or max(1, -(-args.concurrency // workers_n))

    database_url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/studio_bench")
    broker_url = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")
    scratch = Path(tempfile.mkdtemp(prefix="vlm-bench-"))
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
    ensure_database(database_url)

    import django

    django.setup()
    from django.core.management import call_command

    from rollouts.rollout_settings import RolloutSettings
    from studio.celery import app

    call_command("migrate", verbosity=0)
    app.conf.task_default_queue = QUEUE
    django.conf.settings.STUDIO_MODEL_QUEUE = QUEUE  # where model episodes are sent
    app.control.purge()

    server = Endpoint(delay=DELAY)
    endpoint_name = ""
    if args.priced:
        from decimal import Decimal

        from studio.models import Endpoint as NamedEndpoint

        endpoint_name = "bench-priced"
        NamedEndpoint.objects.update_or_create(
            name=endpoint_name,
            defaults={
                "kind": NamedEndpoint.Kind.CHAT,
                "base_url": server.url,
                "input_price_per_million": Decimal("0.15"),
                "output_price_per_million": Decimal("0.60"),
                "concurrency": args.concurrency,
            },
        )

    def settings(name: str, seeds: range, steps: int) -> RolloutSettings:
        return RolloutSettings(
            policy="openai",
            model="bench-vlm",
            base_url=server.url,
            endpoint=endpoint_name,
            seeds=tuple(seeds),
            steps=steps,
            concurrency=args.concurrency,
            history_frames=args.history_frames,
            name=name,
        )

    def seeds(run: int) -> range:
        # Seeds of each run's own: the same seeds play the same frames (the endpoint answers
        # alike), which the frame store keeps once, so a run on seeds played before would
        # write no image file at all.
        return range(run * args.episodes, (run + 1) * args.episodes)

    trace_dir = scratch / "trace"
    worker_env = env
    if args.timeline:
        trace_dir.mkdir()
        worker_env = {**env, "VLM_TRACE_DIR": str(trace_dir), "PYTHONPATH": str(ROOT)}
    workers = start_workers(
        worker_env,
        scratch,
        workers=workers_n,
        threads=threads,
        app="benchmarks.vlm_trace" if args.timeline else "studio",
    )
    try:
        wait_for_workers(app, workers)
        # Warm the workers (imports, JIT, connections, every thread) on other seeds, untimed.
        run_batch(settings("vlm bench warm-up", seeds(WARM_UP_RUN), 1))
        # Best of a few runs: on a shared host the others' load, not this code, adds the noise.
        runs = []
        pids = [w.pid for w in workers]
        print("vlm_concurrency: warmed up, timed runs start", file=sys.stderr, flush=True)
        for run in range(repeat):
            for path in trace_dir.glob("*.jsonl"):
                path.write_text("")  # the last run's timeline only
            before, _ = server.counts(reset=True)
            endpoint_before = cpu_seconds([server.pid])[0]
            cpu_before, load = cpu_seconds(pids), os.getloadavg()[0]
            servers_before = server_cpu_seconds()
            elapsed, batch = run_batch(
                settings("vlm bench", seeds(run), args.turns), earliest=args.turns * DELAY
            )
            cpu_after = cpu_seconds(pids)
            servers = server_cpu_delta(servers_before, server_cpu_seconds())
            endpoint_cpu = cpu_seconds([server.pid])[0] - endpoint_before
            after, max_in_flight = server.counts()
            runs.append(
                (
                    elapsed,
                    batch,
                    [a - b for a, b in zip(cpu_after, cpu_before, strict=True)],
                    after - before,
                    max_in_flight,
                    load,
                    endpoint_cpu,
                    servers,
                )
            )
    finally:
        stop_workers(workers)

    elapsed, batch, cpu_each, calls, max_in_flight, load, endpoint_cpu, servers = min(
        runs, key=lambda r: r[0]
    )
    worker_cpu = sum(cpu_each)
    ideal = calls * DELAY / args.concurrency
    result: dict[str, object] = {
        "benchmark": "vlm_concurrency",
        "episodes": args.episodes,
        "turns_per_episode": args.turns,
        "server_delay_s": DELAY,
        "concurrency": args.concurrency,
        "history_frames": args.history_frames,
        "workers": workers_n,
        "threads_per_worker": threads,
        "batch_status": batch.status,
        "all_runs_finished": all(r[1].status == "finished" for r in runs),
        "model_calls": calls,
        "recorded_model_calls": batch.model_calls,
        "model_errors": batch.model_errors,
        "max_in_flight": max_in_flight,
        "elapsed_s": round(elapsed, 3),
        "elapsed_runs_s": [round(r[0], 3) for r in runs],
        "enqueue_runs_s": [round(r[1].enqueue_s, 3) for r in runs],
        "ideal_s": round(ideal, 3),
        "ratio_to_ideal": round(ideal / elapsed, 3),
        # The workers' own CPU time (all their threads) per model call: what the game, the
        # request, the answer and the rows cost, whatever else the host was doing.
        "worker_cpu_s": round(worker_cpu, 2),
        "worker_cpu_each_s": [round(cpu, 2) for cpu in cpu_each],
        "cpu_per_call_ms": round(1000 * worker_cpu / max(calls, 1), 2),
        "cpu_per_call_runs_ms": [round(1000 * sum(r[2]) / max(r[3], 1), 2) for r in runs],
        # The endpoint's own CPU per call: it shares the host's cores with the workers.
        "endpoint_cpu_per_call_ms": round(1000 * endpoint_cpu / max(calls, 1), 2),
        # The database's and the broker's, where they run on this host (None elsewhere).
        **{
            f"{kind}_cpu_per_call_ms": None if cpu is None else round(1000 * cpu / max(calls, 1), 2)
            for kind, cpu in servers.items()
        },
        "host_cpus": os.cpu_count(),
        "host_load_1m_before": round(load, 2),
        "host_load_1m_runs": [round(r[5], 2) for r in runs],
    }

    if args.timeline:
        from benchmarks.vlm_trace import summarize

        result["timeline"] = summarize(trace_dir, start=runs[-1][1].wall_start)
        result["timeline"]["enqueue_s"] = round(runs[-1][1].enqueue_s, 3)
        result["timeline"]["elapsed_s"] = round(runs[-1][0], 3)

    if args.skip_sequential:
        sequential = calls * DELAY
        result["sequential_s"] = round(sequential, 3)
        result["sequential_measured"] = False
    else:
        # The same batch played episode after episode in this process, best of as many runs.
        sequential_runs = [
            run_sequential(settings("vlm bench sequential", seeds(repeat + run), args.turns))
            for run in range(repeat)
        ]
        sequential, seq_batch = min(sequential_runs, key=lambda r: r[0])
        result["sequential_s"] = round(sequential, 3)
        result["sequential_runs_s"] = [round(r[0], 3) for r in sequential_runs]
        result["sequential_measured"] = True
        result["sequential_model_calls"] = seq_batch.model_calls
    server.stop()
    result["speedup_vs_sequential"] = round(sequential / elapsed, 2)
    result["targets"] = {"ratio_to_ideal": TARGET_IDEAL, "speedup_vs_sequential": TARGET_SEQUENTIAL}
    result["meets_targets"] = (
        result["ratio_to_ideal"] >= TARGET_IDEAL
        and result["speedup_vs_sequential"] >= TARGET_SEQUENTIAL
        and batch.status == "finished"
    )
    shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
