"""Model work on `make demo`'s own settings: a 10-episode model batch and a probe run, played
by the workers the demo starts (`studio.demo._commands`), against a local endpoint answering
in 200 ms (`vlm_concurrency`'s), with the same probe run `--inline` as the yardstick.

The demo's settings: SQLite and Celery's filesystem broker in a var directory of its own, no
PostgreSQL or Redis. `--root DIR` measures another checkout's code (its demo's workers, its
commands) with this harness, e.g. the code before a change (`git archive main | tar -x`).
Prints one JSON object: wall seconds of each, requests and most in flight at the endpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.vlm_concurrency import DELAY, Endpoint  # noqa: E402

EPISODES = 10
STEPS = 40  # about 8 model calls an episode: the endpoint sends 5 actions a call
CONCURRENCY = 16
PER_EPISODE = 5  # frames per episode of the demo's 4: a set of ~650 questions


def _env(root: Path, var_dir: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "CELERY_BROKER_URL", "STUDIO_MEDIA_ROOT", "SECRET_KEY"}
        and not k.startswith(("DJANGO_", "OPENAI_"))
    }
    env.update(DEBUG="1", STUDIO_VAR_DIR=str(var_dir), PYTHONPATH=str(root), DEMO_PASSWORD="x")
    return env


def _manage(root: Path, env: dict[str, str], *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=root, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"manage.py {' '.join(args)} failed:\n{done.stderr}")
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "{}"
    return json.loads(last) if last.startswith("{") else {}


def _timed(root: Path, env: dict[str, str], *args: str) -> tuple[float, dict]:
    started = time.monotonic()
    summary = _manage(root, env, *args)
    return round(time.monotonic() - started, 2), summary


def _workers(root: Path, env: dict[str, str], var_dir: Path) -> list[subprocess.Popen]:
    listing = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys; from pathlib import Path; from studio.demo import _commands; "
            "print(json.dumps(_commands('0', Path(sys.argv[1]))))",
            str(var_dir),
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    commands = json.loads(listing.stdout)
    return [
        subprocess.Popen(
            command,
            cwd=root,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for name, command in commands.items()
        if "worker" in command
    ]


def _counted(endpoint: Endpoint) -> tuple[int, int]:
    """Requests since the last call and the most in flight at once meanwhile."""
    requests, in_flight = endpoint.counts()
    endpoint.counts(reset=True)
    done = requests - endpoint.seen
    endpoint.seen = requests
    return done, in_flight


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to measure")
    args = parser.parse_args()
    root = args.root.resolve()
    endpoint = Endpoint(delay=DELAY)
    endpoint.seen = 0
    workers: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="demo-model-work-") as tmp:
        var_dir = Path(tmp) / "var"
        var_dir.mkdir()
        env = _env(root, var_dir)
        try:
            _manage(root, env, "migrate", "--noinput", "-v0")
            _manage(root, env, "demo_setup")
            _manage(
                root,
                env,
                "shell",
                "-c",
                "from studio.models import Endpoint; Endpoint.objects.create("
                f"name='bench', base_url='{endpoint.url}', concurrency={CONCURRENCY})",
            )
            probe_set = _manage(
                root, env, "probe_set", "--batch", "1", "--per-episode", str(PER_EPISODE)
            )
            workers = _workers(root, env, var_dir)
            time.sleep(8)  # the workers up and polling
            ask = ("--endpoint", "bench", "--model", "bench-vlm")
            _counted(endpoint)
            batch_s, batch = _timed(
                root, env, "rollout", "--policy", "openai", *ask, "--seeds",
                f"100-{99 + EPISODES}", "--steps", str(STEPS), "--concurrency",
                str(CONCURRENCY), "--wait",
            )  # fmt: skip
            batch_calls, batch_in_flight = _counted(endpoint)
            run_s, run = _timed(
                root, env, "probe_run", str(probe_set["set_id"]), *ask, "--concurrency",
                str(CONCURRENCY), "--wait",
            )  # fmt: skip
            run_calls, run_in_flight = _counted(endpoint)
            inline_s, _ = _timed(
                root, env, "probe_run", str(probe_set["set_id"]), *ask, "--concurrency",
                str(CONCURRENCY), "--inline",
            )  # fmt: skip
            _, inline_in_flight = _counted(endpoint)
        finally:
            for worker in workers:
                os.killpg(worker.pid, 9)
            endpoint.stop()
    print(
        json.dumps(
            {
                "root": str(root),
                "delay_s": DELAY,
                "batch": {
                    "episodes": EPISODES,
                    "model_calls": batch.get("model_calls"),
                    "finished": batch.get("finished"),
                    "wall_s": batch_s,
                    "most_in_flight": batch_in_flight,
                    "ideal_s": round(batch_calls * DELAY / min(CONCURRENCY, EPISODES), 2),
                },
                "probe_run": {
                    "questions": run.get("questions"),
                    "answered": run.get("answered"),
                    "requests": run_calls,
                    "wall_s": run_s,
                    "most_in_flight": run_in_flight,
                    "inline_wall_s": inline_s,
                    "inline_most_in_flight": inline_in_flight,
                    "ideal_s": round(run_calls * DELAY / CONCURRENCY, 2),
                },
            }
        )
    )


if __name__ == "__main__":
    main()
