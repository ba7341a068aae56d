"""Server time of the review pages: the episode viewer (256 turns), the turn list (50,000) and
the comparison of two batches of 1,000 episodes each.

Prints one JSON object. The data is seeded in a database of its own (`studio_bench_review`,
dropped and re-created) with bulk_create: a 256-turn episode whose turns have the size of a
VLM turn (observation, model text, tool call, request with three images) and, with the
history batch, 50,000 turns in all. Observation text and frame state come from a short game
really played (Crafter's baseline players die before step 256).

How it is measured: the studio's WSGI application runs in a child process under Django's
own ThreadedWSGIServer (what `runserver` uses: one process, a thread per request) on
loopback, wrapped so that every response carries `Server-Timing: app;dur=<ms>`, the time
from the request entering Django to the response headers (middleware, session, view,
queries, template). Clients are real HTTP clients (http.client) in this process, logged in
with a session cookie: one client in a row, then 8 clients in 8 threads at once. "server"
is the Server-Timing value, "round_trip" what the client waited. With 8 clients the server's
threads share one interpreter lock: production runs several worker processes.

Baseline, measured in the same run the same way: `/bench/static/`, a login-required view that
returns a fixed page without touching a table but the session's, served by the same server
through the same middleware (sessions, authentication, CSRF, WhiteNoise, htmx). Each page's
`over_static_p50_ms` is what its own work adds to that.

The comparison page (`/compare/?batches=A,B`: statistics with 1,000-resample bootstraps) is
timed for two batches of 1,000 episodes and, as the baseline in the same run, two batches of
100; its query count is taken for both with Django's test client (it must not grow with the
batches). Episodes are written directly with achievements drawn from fixed rates, 1% failed.

    python benchmarks/review_pages.py [--requests 60] [--concurrent 8] [--only compare]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# Another name lets two runs on one server stay apart (the database is dropped first).
DATABASE = os.environ.get("BENCH_REVIEW_DATABASE", "studio_bench_review")
TOTAL_TURNS = 50_000
EPISODE_TURNS = 256
COMPARE_EPISODES = 1_000
COMPARE_BASELINE_EPISODES = 100


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    k = (len(ordered) - 1) * q
    low, high = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


def _summary(samples: list[tuple[float, float]]) -> dict[str, float]:
    server = [s for s, _ in samples]
    trip = [t for _, t in samples]
    return {
        "requests": len(samples),
        "server_p50_ms": round(_percentile(server, 0.5), 2),
        "server_p95_ms": round(_percentile(server, 0.95), 2),
        "round_trip_p50_ms": round(_percentile(trip, 0.5), 2),
        "round_trip_p95_ms": round(_percentile(trip, 0.95), 2),
        "server_mean_ms": round(statistics.fmean(server), 2),
    }


# --- seeding ------------------------------------------------------------------------------


def _frame(episode, step: int, state: dict):
    """A frame row; its PNG is never fetched here (the pages' HTML is what is timed)."""
    import hashlib

    from rollouts.models import Frame

    sha = hashlib.sha256(f"{episode.id}:{step}".encode()).hexdigest()
    return Frame(
        episode=episode,
        step=step,
        sha256=sha,
        image=f"frames/{sha[:2]}/{sha[2:4]}/{sha}.png",
        width=64,
        height=64,
        state=state,
    )


def seed() -> dict[str, int]:
    """Returns the ids the benchmark asks for."""
    from django.contrib.auth.models import User
    from django.db import transaction

    from rollouts.game.tools import SYSTEM_PROMPT, tool_call
    from rollouts.models import Episode, Frame, RolloutBatch, Turn
    from rollouts.recording import services
    from rollouts.rollout_settings import RolloutSettings

    # Crafter's scripted and random players die before step 256, so the viewer's episode is
    # written directly, from the observation text and state of a short game really played.
    batch = services.batch_run_inline(
        settings=RolloutSettings(policy="scripted", seeds=(1,), steps=8)
    )
    played = batch.episodes.get()
    assert played.status == "finished", played.error
    real_turn = played.turns.select_related("frame").order_by("index").last()
    observation, state = real_turn.observation_text, real_turn.frame.state

    batch = RolloutBatch.objects.create(
        name="bench viewer",
        policy="openai",
        model="bench-vlm",
        seeds=[1],
        episodes_total=1,
        episodes_finished=1,
        status=RolloutBatch.Status.FINISHED,
    )
    viewer_episode = Episode.objects.create(
        batch=batch, seed=1, status="finished", steps=EPISODE_TURNS
    )
    frames = Frame.objects.bulk_create(
        _frame(viewer_episode, i, state) for i in range(EPISODE_TURNS + 1)
    )
    # What an openai-policy turn holds: the viewer reads and ships all of it.
    Turn.objects.bulk_create(
        Turn(
            episode=viewer_episode,
            index=i,
            frame=frames[i],
            observation_text=observation,
            model_text=(
                "I see trees to the right and water below. I will walk right twice and "
                "collect wood, then look for a place to put a table. " * 2
            ),
            tool_calls=[tool_call(["move_right", "move_right", "do"], f"call_{i}")],
            actions=["move_right", "move_right", "do"],
            request_messages=[
                {"role": "system", "content": SYSTEM_PROMPT},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": observation},
                        *[
                            {"type": "image_url", "image_url": {"frame_step": s}}
                            for s in sorted({max(i - 2, 0), max(i - 1, 0), i})
                        ],
                    ],
                },
            ],
            prompt_tokens=1450,
            completion_tokens=60,
            latency_ms=830,
        )
        for i in range(EPISODE_TURNS)
    )

    # The rest of the 50,000 turns: written directly, like a long history of batches.
    remaining = TOTAL_TURNS - EPISODE_TURNS
    episodes_needed = -(-remaining // EPISODE_TURNS)
    achievements = ["collect_wood", "place_table", "collect_sapling", "wake_up"]
    with transaction.atomic():
        bulk = RolloutBatch.objects.create(
            name="bench history",
            policy="openai",
            model="bench-vlm",
            seeds=list(range(episodes_needed)),
            episodes_total=episodes_needed,
            episodes_finished=episodes_needed,
            status=RolloutBatch.Status.FINISHED,
        )
        episodes = Episode.objects.bulk_create(
            Episode(batch=bulk, seed=s, status="finished", steps=EPISODE_TURNS)
            for s in range(episodes_needed)
        )
        written = 0
        for episode in episodes:
            count = min(EPISODE_TURNS, remaining - written)
            if count <= 0:
                break
            frames = Frame.objects.bulk_create(_frame(episode, i, state) for i in range(count))
            Turn.objects.bulk_create(
                Turn(
                    episode=episode,
                    index=i,
                    frame=frames[i],
                    observation_text=observation,
                    model_text="Walk right and chop the tree.",
                    tool_calls=[tool_call(["move_right", "do"], f"call_{i}")],
                    actions=["move_right", "do"],
                    achievements_unlocked=[achievements[i % 4]] if i % 37 == 0 else [],
                    error="HTTP 429 from the endpoint" if i % 101 == 0 else "",
                    error_kind="http_429" if i % 101 == 0 else "",
                    flagged=i % 13 == 0,
                )
                for i in range(count)
            )
            written += count
    # Fresh bulk-loaded tables have no planner statistics yet; a live database has them.
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    user = User.objects.create_superuser("bench", password="bench-pass-123")
    from django.test import Client

    client = Client()
    client.force_login(user)
    return {
        "episode_id": viewer_episode.id,
        "history_batch_id": bulk.id,
        "turns": Turn.objects.count(),
        "session": client.cookies["sessionid"].value,
    }


def seed_comparison() -> dict[str, list[int]]:
    """Two pairs of batches on the same seeds: 2 x 1,000 episodes and 2 x 100 (the baseline)."""
    import random

    from rollouts.game.crafter_env import ACHIEVEMENTS
    from rollouts.models import Episode, RolloutBatch

    pairs: dict[str, list[int]] = {}
    for size in (COMPARE_EPISODES, COMPARE_BASELINE_EPISODES):
        ids = []
        for model, skill in (("bench-base", 0.25), ("bench-tuned", 0.35)):
            rng = random.Random(f"{model}:{size}")
            batch = RolloutBatch.objects.create(
                name=f"{model} x{size}",
                policy="openai",
                model=model,
                seeds=list(range(size)),
                episodes_total=size,
                episodes_finished=size,
                status=RolloutBatch.Status.FINISHED,
            )
            episodes = []
            for seed in range(size):
                # Easier achievements (earlier in a rough tech tree) are unlocked more often.
                unlocked = {
                    name: 10 * i
                    for i, name in enumerate(ACHIEVEMENTS)
                    if rng.random() < skill * (1.0 if i % 4 == 0 else 0.4)
                }
                failed = rng.random() < 0.01
                episodes.append(
                    Episode(
                        batch=batch,
                        seed=seed,
                        status="failed" if failed else "finished",
                        steps=rng.randint(60, 256),
                        total_reward=float(len(unlocked)),
                        achievements={} if failed else unlocked,
                        achievement_count=0 if failed else len(unlocked),
                    )
                )
            Episode.objects.bulk_create(episodes)
            ids.append(batch.id)
        pairs[f"{size}"] = ids
    return pairs


def compare_queries(path: str, session_user: str = "bench") -> int:
    """Queries the comparison page makes, counted in this process with the test client."""
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    client.force_login(User.objects.get(username=session_user))
    with CaptureQueriesContext(connection) as queries:
        response = client.get(path)
    assert response.status_code == 200, response.status_code
    return len(queries)


# --- the server (child process) -----------------------------------------------------------


def _static_page(request):
    """The baseline: the same stack, a fixed body, no query of its own."""
    from django.http import HttpResponse

    return HttpResponse(b"<!doctype html><title>static</title><p>static baseline</p>")


def _bench_urlpatterns() -> list:
    from django.contrib.auth.decorators import login_required
    from django.urls import include, path

    return [
        path("bench/static/", login_required(_static_page)),
        path("", include("studio.urls")),
    ]


def __getattr__(name: str):
    # This module is the child's ROOT_URLCONF; its patterns are built once Django is set up.
    if name == "urlpatterns":
        return _bench_urlpatterns()
    raise AttributeError(name)


def serve() -> None:
    """Run the studio under a threaded WSGI server; print the port, serve until killed."""
    import django

    django.setup()
    from django.conf import settings

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    settings.ROOT_URLCONF = "review_pages"
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
    from django.core.wsgi import get_wsgi_application

    app = get_wsgi_application()

    def timed(environ, start_response):
        start = time.perf_counter()

        def start_with_timing(status, headers, exc_info=None):
            elapsed = (time.perf_counter() - start) * 1000
            headers.append(("Server-Timing", f"app;dur={elapsed:.3f}"))
            return start_response(status, headers, exc_info)

        return app(environ, start_with_timing)

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = ThreadedWSGIServer(("127.0.0.1", 0), Quiet, ipv6=False, allow_reuse_address=True)
    server.set_app(timed)
    print(server.server_address[1], flush=True)
    server.serve_forever()


# --- the clients --------------------------------------------------------------------------


def fetch(port: int, path: str, session: str) -> tuple[float, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    start = time.perf_counter()
    conn.request("GET", path, headers={"Cookie": f"sessionid={session}"})
    response = conn.getresponse()
    body = response.read()
    trip = (time.perf_counter() - start) * 1000
    conn.close()
    if response.status != 200:
        raise RuntimeError(f"GET {path}: {response.status} {body[:200]!r}")
    timing = response.getheader("Server-Timing", "app;dur=0")
    return float(timing.split("dur=")[1]), trip


def run_single(port: int, path: str, session: str, requests: int) -> list[tuple[float, float]]:
    for _ in range(5):  # warm caches and connections
        fetch(port, path, session)
    return [fetch(port, path, session) for _ in range(requests)]


def run_concurrent(
    port: int, path: str, session: str, requests: int, clients: int
) -> list[tuple[float, float]]:
    samples: list[tuple[float, float]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(clients)
    errors: list[BaseException] = []

    def client() -> None:
        try:
            barrier.wait()
            mine = [fetch(port, path, session) for _ in range(requests)]
            with lock:
                samples.extend(mine)
        except BaseException as exc:  # reported below, after every thread ended
            errors.append(exc)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=60, help="per page, single client")
    parser.add_argument("--concurrent", type=int, default=8, help="clients at once")
    parser.add_argument(
        "--only", choices=("review", "compare"), help="time only these pages (shorter run)"
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import ROOT, setup_django

    os.environ.setdefault("STUDIO_MEDIA_ROOT", tempfile.mkdtemp(prefix="bench-review-media-"))
    os.environ.pop("DEBUG", None)
    seed_start = time.perf_counter()
    setup_django(DATABASE)
    if args.only == "compare":
        from django.contrib.auth.models import User
        from django.test import Client

        user = User.objects.create_superuser("bench", password="bench-pass-123")
        client = Client()
        client.force_login(user)
        ids: dict = {"session": client.cookies["sessionid"].value}
    else:
        ids = seed()
    pairs = seed_comparison() if args.only != "review" else {}
    seed_seconds = time.perf_counter() - seed_start
    compare_paths = {size: f"/compare/?batches={a},{b}" for size, (a, b) in pairs.items()}
    query_counts = {size: compare_queries(path) for size, path in compare_paths.items()}

    from django.db import connections

    connections.close_all()
    child = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--serve"],
        cwd=str(ROOT),
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(child.stdout.readline().strip())
        pages = {"baseline_static_page": "/bench/static/"}
        if args.only != "compare":
            pages |= {
                "episode_viewer_256_turns": f"/episodes/{ids['episode_id']}/",
                "turn_list_50k": "/turns/",
                "turn_list_50k_filtered": (
                    f"/turns/?batch={ids['history_batch_id']}&flagged=exclude"
                    "&achievement=collect_wood"
                ),
            }
        per_client = max(args.requests // 3, 10)  # per concurrent client
        result: dict[str, object] = {
            "server": "Django ThreadedWSGIServer in a child process; http.client clients",
            "seed_seconds": round(seed_seconds, 1),
        }
        if args.only != "compare":
            result["turns"] = ids["turns"]
            result["episode_turns"] = EPISODE_TURNS
        for name, path in pages.items():
            single = run_single(port, path, ids["session"], args.requests)
            concurrent = run_concurrent(port, path, ids["session"], per_client, args.concurrent)
            result[name] = {
                "single_client": _summary(single),
                f"{args.concurrent}_concurrent_clients": _summary(concurrent),
            }
        static = result["baseline_static_page"]["single_client"]["server_p50_ms"]
        for name in pages:
            if name != "baseline_static_page":
                p50 = result[name]["single_client"]["server_p50_ms"]
                result[name]["over_static_p50_ms"] = round(p50 - static, 2)
                result[name]["ratio_to_static_p50"] = round(p50 / static, 1) if static else None
        result["note"] = "shared 2-core machine: other processes were running"
        if compare_paths:
            # Single client only: each request is CPU-bound statistics, and the point is how
            # it grows with the batches, not how one interpreter shares its lock.
            timed = {
                size: _summary(run_single(port, path, ids["session"], min(args.requests, 30)))
                for size, path in compare_paths.items()
            }
            large, small = str(COMPARE_EPISODES), str(COMPARE_BASELINE_EPISODES)
            result["compare_two_batches"] = {
                f"episodes_per_batch_{large}": {**timed[large], "queries": query_counts[large]},
                f"episodes_per_batch_{small}": {**timed[small], "queries": query_counts[small]},
                "server_p50_ratio_1000_vs_100": round(
                    timed[large]["server_p50_ms"] / max(timed[small]["server_p50_ms"], 1e-9), 2
                ),
                "queries_grow_with_batches": query_counts[large] != query_counts[small],
            }
        print(json.dumps(result))
    finally:
        child.terminate()
        child.wait(timeout=30)


if __name__ == "__main__":
    main()
