"""Export throughput and memory: prints one JSON object.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/anything .venv/bin/python \
        benchmarks/export_throughput.py

Uses a database of its own, `studio_bench_export` on the server DATABASE_URL names (created
and migrated here), and its own media root. Seeds 80,000 image turns quickly with
bulk_create (turns share a few real Crafter frames per episode) in two batches: 20,000 and
60,000 turns.

* rows/s of the real export (`datasets.exporting.export_files`: PostgreSQL cursor, row
  building, sha256, file) over the 20,000 turns, next to a raw loop that only `json.dumps`
  the same rows, prebuilt in memory, in the same run; and their ratio (target >= 0.5).
* peak RSS (VmHWM on Linux, else ru_maxrss) of a fresh process exporting 20,000 and
  80,000 rows (target: less than 10% growth), each export in its own subprocess.
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
DB_NAME = "studio_bench_export"
SMALL, LARGE = 20_000, 80_000
TURNS_PER_EPISODE = 250
FRAMES_PER_EPISODE = 4
REPEATS = 3


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


def _seed() -> tuple[int, int]:
    """Two batches of image turns (20,000 and 60,000); reused when already there."""
    from rollouts.crafter_env import ACTIONS, StudioEnv, encode_png, text_observation
    from rollouts.frame_store import FrameStore
    from rollouts.models import Episode, Frame, RolloutBatch, Turn

    names = ("bench-20k", "bench-60k")
    existing = {b.name: b for b in RolloutBatch.objects.filter(name__in=names)}
    counts = {n: Turn.objects.filter(episode__batch=b).count() for n, b in existing.items()}
    if counts.get(names[0]) == SMALL and counts.get(names[1]) == LARGE - SMALL:
        return existing[names[0]].id, existing[names[1]].id
    RolloutBatch.objects.filter(name__in=names).delete()

    store = FrameStore()
    env = StudioEnv(seed=0, size=64, length=10_000)
    pixels = env.reset()
    samples = []
    for step in range(FRAMES_PER_EPISODE * 8):
        png = encode_png(pixels).png
        samples.append((store.put(png), text_observation(env)))
        pixels, _, _, _ = env.step(2 + step % 4)
    ids = []
    for name, total in zip(names, (SMALL, LARGE - SMALL), strict=True):
        episodes_n = total // TURNS_PER_EPISODE
        batch = RolloutBatch.objects.create(
            name=name,
            policy="scripted",
            seeds=list(range(episodes_n)),
            episodes_total=episodes_n,
            episodes_finished=episodes_n,
            status="finished",
        )
        episodes = Episode.objects.bulk_create(
            Episode(batch=batch, seed=s, status="finished", steps=TURNS_PER_EPISODE)
            for s in range(episodes_n)
        )
        for e_i, episode in enumerate(episodes):
            frames = Frame.objects.bulk_create(
                Frame(
                    episode=episode,
                    step=k,
                    sha256=samples[(e_i + k) % len(samples)][0][0],
                    image=samples[(e_i + k) % len(samples)][0][1],
                    width=64,
                    height=64,
                )
                for k in range(FRAMES_PER_EPISODE)
            )
            Turn.objects.bulk_create(
                Turn(
                    episode=episode,
                    index=i,
                    frame=frames[i % FRAMES_PER_EPISODE],
                    observation_text=samples[(e_i + i) % len(samples)][1],
                    actions=[ACTIONS[1 + i % 5]],
                    achievements_unlocked=["collect_wood"] if i == 17 else [],
                    reward=1.0 if i == 17 else 0.0,
                )
                for i in range(TURNS_PER_EPISODE)
            )
        ids.append(batch.id)
    return ids[0], ids[1]


def _export(batch_ids: tuple[int, ...], output: Path):
    from datasets.exporting import export_files
    from datasets.filters import DatasetFilters, ExportOptions

    return export_files(
        filters=DatasetFilters(batches=batch_ids), options=ExportOptions(), output=output
    )


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


def main() -> None:
    env = _bench_env()
    _create_database(env.pop("ADMIN_URL"))
    os.environ.update(env)
    _setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    small_id, large_id = _seed()

    # Best of REPEATS, export and raw loop interleaved: the machine may be shared.
    export_seconds = dumps_seconds = float("inf")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.jsonl"
        result = _export((small_id,), out)  # warm the page cache and the database
        rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
        for _ in range(REPEATS):
            start = time.perf_counter()
            result = _export((small_id,), out)
            export_seconds = min(export_seconds, time.perf_counter() - start)
            start = time.perf_counter()
            for row in rows:
                json.dumps(row, ensure_ascii=False)
            dumps_seconds = min(dumps_seconds, time.perf_counter() - start)
    del rows

    export_rate = result.train.rows / export_seconds
    dumps_rate = result.train.rows / dumps_seconds
    small = _child_run(env, (small_id,))
    large = _child_run(env, (small_id, large_id))
    print(
        json.dumps(
            {
                "rows": result.train.rows,
                "export_rows_per_s": round(export_rate, 1),
                "raw_json_dumps_rows_per_s": round(dumps_rate, 1),
                "ratio": round(export_rate / dumps_rate, 3),
                "ratio_target": 0.5,
                "best_of": REPEATS,
                "bytes_per_row": round(result.train.bytes / result.train.rows, 1),
                "peak_rss_kb_20000": small["maxrss_kb"],
                "peak_rss_kb_80000": large["maxrss_kb"],
                "rows_exported_in_rss_runs": [small["rows"], large["rows"]],
                "rss_growth": round(large["maxrss_kb"] / small["maxrss_kb"] - 1, 4),
                "rss_growth_target": 0.10,
            }
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", nargs="+", type=int, metavar="BATCH_ID")
    args = parser.parse_args()
    if args.child:
        child(tuple(args.child))
    else:
        main()
