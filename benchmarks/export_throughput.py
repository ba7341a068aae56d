"""Export throughput and memory: prints one JSON object.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/anything .venv/bin/python \
        benchmarks/export_throughput.py [--rows 20000] [--large-rows 1000000]

Uses a database of its own, `studio_bench_export` on the server DATABASE_URL names (created
and migrated here), and its own media root. Seeds with bulk_create, every turn with a frame
of its own and a distinct PNG (real Crafter frames, each marked with its turn number in one
corner pixel row), as recording does, so the export's image cache only hits where a real
export would (history frames of the previous turns):

* `baseline`: ROWS turns of a scripted batch, rows rebuilt from the turn (no stored request);
* `recorded`: ROWS turns of an `openai` batch whose turns store the request the policy
  would have sent (`rollouts.policies.openai.messages.build_messages`, 2 history frames:
  3 images a row), the model's text and its tool call, exported as sent;
* and 3 x ROWS more baseline turns for the memory run.

Figures:

* rows/s of the real export (`curation.exporting.export_files`: PostgreSQL cursor, row
  building, PNG reads and base64, sha256, file) for each kind, next to a raw loop that only
  `json.dumps` the same rows, prebuilt in memory, in the same run; and their ratio
  (target >= 0.5). Best of 3, export and raw loop interleaved.
* peak RSS (VmHWM on Linux, else ru_maxrss) of a fresh process exporting ROWS and 4 x ROWS
  rows (target: less than 10% growth), each export in its own subprocess.
* `bucket`: BUCKET_ROWS baseline turns exported from local disk and from an S3 bucket (moto's
  S3 server on loopback, started here; `--no-bucket` leaves it out): rows/s of each, best of
  REPEATS, the bucket's both through the studio's frame reads (one GET a frame) and through
  Django's storage API (what they were before), with moto's own latency for one GET.
* `--large-rows N`: one more baseline batch of N turns (each its own PNG; seeded once and
  kept, ~1 KB of PNG a turn), exported once in a fresh process: rows/s and peak RSS at N
  rows next to the same export of ROWS rows in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
DB_NAME = os.environ.get("BENCH_DATABASE") or "studio_bench_export"
TURNS_PER_EPISODE = 250
SAMPLE_FRAMES = 32
HISTORY_FRAMES = 2
REPEATS = 3
BUCKET_ROWS = 2_000


def _bench_env() -> dict[str, str]:
    url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    parts = urlsplit(url)
    if not parts.scheme.startswith("postgres"):
        sys.exit("export_throughput: DATABASE_URL must name a PostgreSQL server")
    bench_url = urlunsplit(parts._replace(path=f"/{DB_NAME}"))
    media = os.environ.get("BENCH_MEDIA_ROOT", str(Path(tempfile.gettempdir()) / DB_NAME))
    return {
        **os.environ,
        "DATABASE_URL": bench_url,
        "STUDIO_MEDIA_ROOT": media,
        "SECRET_KEY": os.environ.get("SECRET_KEY", "bench-only"),
        "DEBUG": "0",
        "DJANGO_SETTINGS_MODULE": "studio.settings",
        "ADMIN_URL": urlunsplit(parts._replace(path="/postgres")),
    }


def _create_database(admin_url: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{DB_NAME}"')


def _setup() -> None:
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def _seed(rows: int, large_rows: int = 0) -> dict[str, int]:
    """The three batches (see the module's docstring), and the large one when asked for;
    reused when already there."""
    from django.db.models import Max

    from rollouts.models import RolloutBatch, Turn

    wanted = {
        "bench-baseline": rows,
        "bench-recorded": rows,
        "bench-more": 3 * rows,
        "bench-bucket": min(rows, BUCKET_ROWS),
    }
    if large_rows:
        wanted[f"bench-large-{large_rows}"] = large_rows
    existing = {b.name: b for b in RolloutBatch.objects.filter(name__in=wanted)}
    counts = {n: Turn.objects.filter(episode__batch=b).count() for n, b in existing.items()}
    kept = {name: existing[name].id for name in wanted if counts.get(name) == wanted[name]}
    if len(kept) == len(wanted):
        return kept
    RolloutBatch.objects.filter(name__in=set(wanted) - set(kept)).delete()
    samples = _sample_frames()
    # Distinct images across batches, those kept included: each run's serials start past
    # every earlier run's (a batch holds fewer than 10 million turns; 4 bytes hold them).
    last_batch = RolloutBatch.objects.aggregate(last=Max("id"))["last"] or 0
    serial = iter(range(last_batch * 10**7 + 1, 2**32))
    seeded = {
        name: _seed_batch(
            name=name,
            turns=total,
            recorded=name == "bench-recorded",
            samples=samples,
            serial=serial,
        )
        for name, total in wanted.items()
        if name not in kept
    }
    # What autovacuum would do soon after a load: without statistics the planner took the
    # batch for 8 episodes and sorted a million turns on disk (986 MB) before the first row.
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return kept | seeded


def _sample_frames() -> list[tuple[object, str]]:
    """Real Crafter frames (pixels) and their text observations."""
    from rollouts.game.crafter_env import StudioEnv, text_observation

    env = StudioEnv(seed=0, size=64, length=10_000)
    pixels = env.reset()
    samples = []
    for step in range(SAMPLE_FRAMES):
        samples.append((pixels.copy(), text_observation(env)))
        pixels, _, _, _ = env.step(2 + step % 4)
    return samples


def _seed_batch(*, name: str, turns: int, recorded: bool, samples, serial) -> int:
    from rollouts.game.crafter_env import ACTIONS, encode_png
    from rollouts.game.tools import tool_call
    from rollouts.models import Episode, Frame, RolloutBatch, Turn
    from rollouts.policies.base import Observation, PastTurn
    from rollouts.policies.openai.messages import build_messages
    from rollouts.recording.frame_store import FrameStore
    from rollouts.rollout_settings import RolloutSettings

    store = FrameStore()
    episodes_n = max(1, turns // TURNS_PER_EPISODE)
    settings = RolloutSettings(
        policy="openai" if recorded else "scripted",
        model="bench-vlm" if recorded else "",
        seeds=tuple(range(episodes_n)),
        history_frames=HISTORY_FRAMES if recorded else 0,
    )
    batch = RolloutBatch.objects.create(
        name=name,
        policy=settings.policy,
        model=settings.model,
        settings=settings.to_json(),
        seeds=list(settings.seeds),
        episodes_total=episodes_n,
        episodes_finished=episodes_n,
        status="finished",
    )
    episodes = Episode.objects.bulk_create(
        Episode(batch=batch, seed=s, status="finished", steps=TURNS_PER_EPISODE)
        for s in range(episodes_n)
    )
    for e_i, episode in enumerate(episodes):
        pngs, frames = [], []
        for k in range(TURNS_PER_EPISODE):
            pixels = samples[(e_i + k) % len(samples)][0].copy()
            # A distinct image per turn: the turn's serial number in the top-left pixels.
            pixels[0, :4] = [[b, b, b] for b in next(serial).to_bytes(4, "big")]
            png = encode_png(pixels).png
            sha256, image = store.put(png)
            pngs.append(png)
            frames.append(
                Frame(episode=episode, step=k, sha256=sha256, image=image, width=64, height=64)
            )
        frames = Frame.objects.bulk_create(frames)
        rows = []
        for i in range(TURNS_PER_EPISODE):
            text = samples[(e_i + i) % len(samples)][1]
            actions = [ACTIONS[1 + i % 5]]
            extra = {}
            if recorded:
                history = tuple(
                    PastTurn(frame_step=j, png=pngs[j], actions=(ACTIONS[1 + j % 5],))
                    for j in range(max(0, i - HISTORY_FRAMES), i)
                )
                stored, _ = build_messages(
                    settings,
                    Observation(
                        seed=episode.seed,
                        turn=i,
                        step=i,
                        step_limit=settings.steps,
                        text=text,
                        frame_step=i,
                        png=pngs[i],
                        history=history,
                    ),
                )
                extra = {
                    "request_messages": stored,
                    "model_text": f"Turn {i}: I see grass to the right, so I move there.",
                    "tool_calls": [tool_call(actions, f"call_{episode.id}_{i}")],
                    "finish_reason": "tool_calls",
                    "prompt_tokens": 900,
                    "completion_tokens": 40,
                }
            rows.append(
                Turn(
                    episode=episode,
                    index=i,
                    frame=frames[i],
                    observation_text=text,
                    actions=actions,
                    achievements_unlocked=["collect_wood"] if i == 17 else [],
                    reward=1.0 if i == 17 else 0.0,
                    **extra,
                )
            )
        Turn.objects.bulk_create(rows)
    return batch.id


def _export(batch_ids: tuple[int, ...], output: Path, store=None):
    from curation.export_options import ExportOptions
    from curation.exporting import export_files
    from rollouts.review.turn_selection import TurnSelection

    return export_files(
        filters=TurnSelection(batches=batch_ids),
        options=ExportOptions(),
        output=output,
        store=store,
    )


def _best_rate(batch_id: int, store_made) -> tuple[float, str]:
    """Best rows/s of REPEATS exports after a warm one, and the file's sha256."""
    best = float("inf")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.jsonl"
        result = _export((batch_id,), out, store_made())
        for _ in range(REPEATS):
            start = time.perf_counter()
            result = _export((batch_id,), out, store_made())
            best = min(best, time.perf_counter() - start)
    return result.train.rows / best, result.train.sha256


def _bucket_throughput(batch_id: int) -> dict:
    """The same batch exported from local disk, then from a bucket holding its frames."""
    import concurrent.futures

    from django.conf import settings
    from django.test.utils import override_settings

    from rollouts.models import Frame
    from rollouts.recording.frame_store import FrameStore
    from tests.s3_server import CREDENTIALS, Bucket, S3Server, storages_for

    local_rate, local_sha = _best_rate(batch_id, FrameStore)
    server = S3Server().start()
    try:
        bucket = Bucket(server=server, name="bench-export", scratch=Path(tempfile.gettempdir()))
        client = server.client()
        client.create_bucket(Bucket=bucket.name)
        local = FrameStore()
        names = list(
            Frame.objects.filter(episode__batch_id=batch_id).values_list("image", flat=True)
        )
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(
                pool.map(
                    lambda n: client.put_object(Bucket=bucket.name, Key=n, Body=local.read(n)),
                    names,
                )
            )
        start = time.perf_counter()
        for name in names[:200]:
            client.get_object(Bucket=bucket.name, Key=name)["Body"].read()
        get_ms = (time.perf_counter() - start) / min(200, len(names)) * 1000
        os.environ.update(CREDENTIALS)
        with override_settings(STORAGES=storages_for(bucket, settings.STORAGES)):
            rate, sha = _best_rate(batch_id, FrameStore)

            def through_storage_api() -> FrameStore:
                store = FrameStore()
                store._bucket = None  # Django's storage.open for each frame
                return store

            api_rate, api_sha = _best_rate(batch_id, through_storage_api)
    finally:
        server.stop()
    assert sha == api_sha == local_sha, "the bucket's export differs from the local one"
    return {
        "rows": len(names),
        "local_disk_rows_per_s": round(local_rate, 1),
        "bucket_rows_per_s": round(rate, 1),
        "bucket_through_storage_api_rows_per_s": round(api_rate, 1),
        "moto_get_ms": round(get_ms, 2),
        "same_bytes": True,
    }


def child(batch_ids: tuple[int, ...]) -> None:
    _setup()
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        result = _export(batch_ids, Path(tmp) / "rows.jsonl")
        seconds = time.perf_counter() - start
    print(json.dumps({"rows": result.train.rows, "seconds": seconds, "maxrss_kb": _peak_rss_kb()}))


def _peak_rss_kb() -> int:
    """This process's peak RSS. Linux carries ru_maxrss over fork and exec (the parent's
    peak would show), so VmHWM of the process's own memory map is read when available."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _child_run(env: dict[str, str], batch_ids: tuple[int, ...]) -> dict:
    done = subprocess.run(
        [sys.executable, __file__, "--child", *map(str, batch_ids)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _throughput(batch_id: int) -> dict:
    """Best of REPEATS of the real export and of `json.dumps` of its rows, interleaved."""
    export_seconds = dumps_seconds = float("inf")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.jsonl"
        result = _export((batch_id,), out)  # warm the page cache and the database
        rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
        for _ in range(REPEATS):
            start = time.perf_counter()
            result = _export((batch_id,), out)
            export_seconds = min(export_seconds, time.perf_counter() - start)
            start = time.perf_counter()
            for row in rows:
                json.dumps(row, ensure_ascii=False)
            dumps_seconds = min(dumps_seconds, time.perf_counter() - start)
    export_rate = result.train.rows / export_seconds
    dumps_rate = result.train.rows / dumps_seconds
    return {
        "rows": result.train.rows,
        "images": result.train.images,
        "export_rows_per_s": round(export_rate, 1),
        "raw_json_dumps_rows_per_s": round(dumps_rate, 1),
        "ratio": round(export_rate / dumps_rate, 3),
        "bytes_per_row": round(result.train.bytes / result.train.rows, 1),
    }


def main(rows: int, large_rows: int = 0, bucket: bool = True) -> None:
    env = _bench_env()
    _create_database(env.pop("ADMIN_URL"))
    os.environ.update(env)
    _setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    started = time.perf_counter()
    ids = _seed(rows, large_rows)
    seed_seconds = time.perf_counter() - started
    baseline = _throughput(ids["bench-baseline"])
    recorded = _throughput(ids["bench-recorded"])
    small = _child_run(env, (ids["bench-baseline"],))
    large = _child_run(env, (ids["bench-baseline"], ids["bench-more"]))
    from_bucket = {"bucket": _bucket_throughput(ids["bench-bucket"])} if bucket else {}
    at_scale = {}
    if large_rows:
        # The same export in a fresh process, of ROWS rows then of N (page cache warmed by
        # the runs above for the first; the second reads what it must).
        of_rows = _child_run(env, (ids["bench-baseline"],))
        of_large = _child_run(env, (ids[f"bench-large-{large_rows}"],))
        at_scale = {
            "large_export": {
                "rows": of_large["rows"],
                "seconds": round(of_large["seconds"], 1),
                "rows_per_s": round(of_large["rows"] / of_large["seconds"], 1),
                "peak_rss_kb": of_large["maxrss_kb"],
                "same_export_of_rows": {
                    "rows": of_rows["rows"],
                    "rows_per_s": round(of_rows["rows"] / of_rows["seconds"], 1),
                    "peak_rss_kb": of_rows["maxrss_kb"],
                },
                "rows_per_s_ratio": round(
                    (of_large["rows"] / of_large["seconds"])
                    / (of_rows["rows"] / of_rows["seconds"]),
                    3,
                ),
                "seed_seconds_this_run": round(seed_seconds, 1),
            }
        }
    print(
        json.dumps(
            {
                "benchmark": "export_throughput",
                "distinct_frames_per_turn": 1,
                "baseline_rows": baseline,
                "recorded_requests": {**recorded, "history_frames": HISTORY_FRAMES},
                "ratio_target": 0.5,
                "best_of": REPEATS,
                "peak_rss_kb_small": small["maxrss_kb"],
                "peak_rss_kb_large": large["maxrss_kb"],
                "rows_exported_in_rss_runs": [small["rows"], large["rows"]],
                "rss_growth": round(large["maxrss_kb"] / small["maxrss_kb"] - 1, 4),
                "rss_growth_target": 0.10,
                "note": "shared 2-core machine: compare ratios, not rates",
                **from_bucket,
                **at_scale,
            }
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", nargs="+", type=int, metavar="BATCH_ID")
    parser.add_argument("--rows", type=int, default=20_000, help="turns of each kind")
    parser.add_argument(
        "--large-rows", type=int, default=0, help="also export a batch of this many turns"
    )
    parser.add_argument(
        "--no-bucket", action="store_true", help="leave out the export from an S3 bucket"
    )
    args = parser.parse_args()
    if args.child:
        child(tuple(args.child))
    else:
        main(args.rows, args.large_rows, bucket=not args.no_bucket)
