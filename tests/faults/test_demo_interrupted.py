"""`make demo`'s Ctrl-C in the middle of a model batch says what it interrupted, and that the
next start resumes it."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from rollouts.tests.openai_server import ChatServer
from tests.faults.stack import ROOT, free_port


def _demo_env(var_dir: Path) -> dict[str, str]:
    # As `make demo` runs it: its SQLite file, embedded broker and key under var/.
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("DATABASE_", "CELERY_", "STUDIO_", "REDIS_", "DJANGO_"))
        and name != "SECRET_KEY"
    }
    env.update(DEBUG="1", STUDIO_VAR_DIR=str(var_dir), DEMO_PORT=str(free_port()))
    return env


def _running(database: Path, batch_id: int) -> list[int]:
    with sqlite3.connect(database, timeout=10) as conn:
        rows = conn.execute(
            "SELECT steps FROM rollouts_episode WHERE batch_id = ? AND status = 'running'"
            " ORDER BY steps",
            (batch_id,),
        ).fetchall()
    return [steps for (steps,) in rows]


def test_ctrl_c_says_which_episodes_it_interrupted_and_that_they_resume(tmp_path):
    var_dir = tmp_path / "var"
    var_dir.mkdir()
    env = _demo_env(var_dir)

    def manage(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    manage("migrate", "--noinput", "-v0")
    endpoint = ChatServer(delay=0.2).start()
    try:
        summary = manage(
            "rollout", "--policy", "openai", "--model", "demo-model", "--base-url",
            endpoint.url, "--seeds", "0-1", "--steps", "300",
        )  # fmt: skip
        batch_id = json.loads(summary.strip().splitlines()[-1])["batch_id"]
        demo = subprocess.Popen(
            [sys.executable, "-m", "studio.demo"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group, as a terminal's foreground job
        )
        try:
            database = var_dir / "studio.sqlite3"
            deadline = time.monotonic() + 180
            # Both episodes under way on the demo's worker (two threads), turns recorded.
            while not ((steps := _running(database, batch_id)) and len(steps) == 2 and steps[0]):
                assert time.monotonic() < deadline and demo.poll() is None, "never both running"
                time.sleep(0.5)
            os.killpg(demo.pid, signal.SIGINT)
            output, _ = demo.communicate(timeout=60)
        finally:
            if demo.poll() is None:
                os.killpg(demo.pid, signal.SIGKILL)
                demo.wait()
    finally:
        endpoint.stop()
    first, second = _running(database, batch_id)  # what they had recorded when stopped
    lines = output.splitlines()
    assert lines[-2:] == [
        f"Interrupted 2 episodes of batch {batch_id} at steps {first} and {second}: the next"
        " `make demo` resumes them from their last recorded turn.",
        "Stopped the studio, the workers and the scheduler.",
    ], output
