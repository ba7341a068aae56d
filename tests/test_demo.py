"""`make demo` as a user runs it: Ctrl-C (SIGINT to its process group) stops everything, fast,
in a few lines, and nothing is left outside the var directory."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from studio.testing import manage as studio_manage
from studio.testing import wait_until

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def _descendants(pid: int) -> set[int]:
    tree, found, todo = _children(), set(), [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _untracked() -> set[str]:
    out = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {line[3:] for line in out.splitlines() if line.startswith("??")}


def test_it_stops_server_worker_and_scheduler_on_ctrl_c(tmp_path):
    var_dir = tmp_path / "var"
    port = _free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "CELERY_BROKER_URL", "STUDIO_MEDIA_ROOT", "SECRET_KEY"}
        and not k.startswith("DJANGO_")
    }
    env.update(STUDIO_VAR_DIR=str(var_dir), DEMO_PORT=str(port), DEMO_PASSWORD="demo-pass-1")
    before = _untracked()
    demo = subprocess.Popen(
        ["make", "--no-print-directory", "demo"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(demo.stdout), daemon=True)
    reader.start()
    try:

        def answers() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return True
            except OSError:
                assert demo.poll() is None, "".join(lines)
                return False

        wait_until(
            answers,
            timeout=240,
            every=0.5,
            what=lambda: "the demo server to answer:\n" + "".join(lines),
        )

        # The worker and scheduler are up too (their own sessions, found by parentage).
        def commands() -> str:
            return " ".join(
                Path(f"/proc/{pid}/cmdline").read_text(errors="replace").replace("\0", " ")
                for pid in _descendants(demo.pid)
                if _alive(pid)
            )

        def all_three() -> bool:
            running = commands()
            return all(
                name in running for name in ("-Q celery", "-Q studio-model", "beat", "runserver")
            )

        wait_until(
            all_three,
            timeout=60,
            every=0.5,
            what=lambda: f"all three to start: {commands()}",
        )
        time.sleep(3)  # the worker past its start-up
        everyone = _descendants(demo.pid) | {demo.pid}
        shown_before = len(lines)

        started = time.monotonic()
        os.killpg(demo.pid, signal.SIGINT)
        while time.monotonic() - started < 10 and any(_alive(pid) for pid in everyone):
            time.sleep(0.1)
        took = time.monotonic() - started
        left = [pid for pid in everyone if _alive(pid)]
        assert not left, f"still running after {took:.1f} s: {left}"
        demo.wait(timeout=5)
        reader.join(timeout=5)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            for pid in _descendants(demo.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    output = "".join(lines)
    assert len(lines) < 20, output
    assert "Segmentation fault" not in output and "Warm shutdown" not in output
    assert lines[shown_before:][-1:] == ["Stopped the studio, the workers and the scheduler.\n"]
    assert (var_dir / "studio.sqlite3").exists() and (var_dir / "broker" / "control").is_dir()
    assert _untracked() == before, "the demo left files outside its var directory"


def _worker_children(demo_pid: int) -> set[int]:
    """The demo's own `celery worker` children (not their pool processes)."""
    tree = _children()
    return {
        pid
        for pid in tree.get(demo_pid, [])
        if _alive(pid)
        and " worker "
        in Path(f"/proc/{pid}/cmdline").read_text(errors="replace").replace("\0", " ")
    }


def test_a_killed_worker_is_started_again_and_a_batch_still_finishes(tmp_path):
    from tests.faults.test_demo_interrupted import _demo_env

    var_dir = tmp_path / "var"
    var_dir.mkdir()
    env = _demo_env(var_dir)

    def manage(*args: str) -> str:
        done = studio_manage(*args, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    manage("migrate", "--noinput", "-v0")
    demo = subprocess.Popen(
        [sys.executable, "-m", "studio.demo"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(demo.stdout), daemon=True)
    reader.start()
    try:
        wait_until(
            lambda: _worker_children(demo.pid),
            timeout=120,
            every=0.5,
            what=lambda: "the demo's worker to start:\n" + "".join(lines),
        )
        time.sleep(3)  # past its start-up
        killed = _worker_children(demo.pid)
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        wait_until(
            lambda: len(_worker_children(demo.pid) - killed) == len(killed),
            timeout=60,
            every=0.5,
            what=lambda: "a new worker for each one killed:\n" + "".join(lines),
        )
        assert demo.poll() is None, "".join(lines)
        summary = manage(
            "rollout", "--policy", "scripted", "--seeds", "0-1", "--steps", "10", "--wait"
        )  # fmt: skip
        outcome = json.loads(summary.strip().splitlines()[-1])
        assert (outcome["finished"], outcome["failed"]) == (2, 0), summary
        assert demo.poll() is None, "".join(lines)
    finally:
        os.killpg(demo.pid, signal.SIGINT)
        try:
            demo.wait(timeout=30)
        finally:
            if demo.poll() is None:
                os.killpg(demo.pid, signal.SIGKILL)
                demo.wait()
        reader.join(timeout=5)
    output = "".join(lines)
    assert output.count("stopped unexpectedly (exit status -9); starting it again.") == len(killed)
