"""`make demo`'s last step: the studio, two workers and the scheduler, stopped together by Ctrl-C.

Each child runs in a session of its own, so the terminal's Ctrl-C reaches only this process,
which stops them in order: TERM to each child's whole process group (a worker's pool
processes included), then KILL to whatever is still there after STOP_SECONDS. Their output
is forwarded until then and dropped after: a shutdown says one line, not one per process.
A shell `trap 'kill 0'` did this before and signalled itself in a loop.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

# Celery's warm shutdown can take longer than this (its timer thread sleeps out its current
# delay); past this the groups are killed. Safe: an episode cut short is resumed from its last
# recorded turn by the next worker (the next `make demo`'s takes its predecessor's over).
STOP_SECONDS = 3.0
# How long Ctrl-C waits for the database to say what was interrupted before it says nothing.
INTERRUPTED_SECONDS = 3.0
BASE_DIR = Path(__file__).resolve().parent.parent
# Model work (model episodes, probe questions: `studio.jobs.JobKind.calls_model`) waits on the
# network, not the cores: a pool of threads sized for waiting, as many as a probe run's or a
# model batch's usual concurrency. Baselines keep a process per core. The queues are those
# `studio.settings` names.
MODEL_THREADS = 16
CORE_QUEUES = "celery,studio-control"
MODEL_QUEUE = "studio-model"
# A worker that ends by itself is started again, up to this many times in this many seconds;
# past that it cannot start at all (its error shows above) and the demo stops.
WORKER_RESTARTS = 5
WORKER_RESTART_WINDOW_SECONDS = 60.0


def _die_with_parent() -> None:
    """Runs in the child before exec: should this process be killed, its children follow."""
    # Not Linux (no libc.so.6): the stop sequence still ends every group.
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _commands(port: str, var_dir: Path) -> dict[str, list[str]]:
    python = sys.executable
    # --quiet: no banners; errors still show.
    celery = [python, "-m", "celery", "-A", "studio", "--quiet"]
    return {
        "worker": [*celery, "worker", "--loglevel=ERROR", "--concurrency=2", "-Q", CORE_QUEUES],
        # A name of its own: each worker takes over at start what its namesake held.
        "model worker": [
            *celery,
            "worker",
            "--loglevel=ERROR",
            "--pool=threads",
            f"--concurrency={MODEL_THREADS}",
            "-Q",
            MODEL_QUEUE,
            "-n",
            "model@%h",
        ],
        "scheduler": [
            *celery,
            "beat",
            "--loglevel=ERROR",
            "--schedule",
            str(var_dir / "celerybeat-schedule"),
            "--pidfile=",
        ],
        "server": [
            python,
            "manage.py",
            "runserver",
            f"127.0.0.1:{port}",
            "--noreload",
            "--skip-checks",
        ],
    }


class Demo:
    def __init__(self, *, port: str, var_dir: Path) -> None:
        self.port = port
        self.var_dir = var_dir
        self.stopping = threading.Event()
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.commands: dict[str, list[str]] = {}
        self.env: dict[str, str] = {}
        # When each worker was last started again by `wait`, by child name.
        self.restarts: dict[str, list[float]] = {}
        # Django, set up in the background while the children start, to say at Ctrl-C what
        # the worker was doing without making the stop wait for it.
        self.django_ready = threading.Event()
        self.django_usable = False

    def start(self) -> None:
        env = {
            **os.environ,
            "DJANGO_RUNSERVER_HIDE_WARNING": "true",
            # The demo runs as whoever starts it, root in a container included: no lecture.
            "PYTHONWARNINGS": "ignore:You're running the worker with superuser privileges",
        }
        self.env = env
        self.commands = _commands(self.port, self.var_dir)
        for name in self.commands:
            self._spawn(name)
        threading.Thread(target=self._set_up_django, daemon=True).start()

    def _spawn(self, name: str) -> None:
        child = subprocess.Popen(
            self.commands[name],
            cwd=BASE_DIR,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self.children[name] = child
        threading.Thread(target=self._forward, args=(child,), daemon=True).start()

    def _set_up_django(self) -> None:
        try:
            os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")
            import django

            django.setup()
            self.django_usable = True
        except Exception:  # without it, Ctrl-C only says less
            pass
        finally:
            self.django_ready.set()

    def interrupted(self) -> list[str]:
        """What the worker held when it was stopped, one line a job kind: "2 episodes of
        batch 3 at steps 74 and 78". Read once the worker is gone, so the steps are the last
        it recorded; nothing when the database cannot say in time."""
        if not self.django_ready.wait(INTERRUPTED_SECONDS) or not self.django_usable:
            return []
        try:
            return jobs_held_lines()
        except Exception:  # the database is gone too: nothing to say
            return []

    def _forward(self, child: subprocess.Popen[bytes]) -> None:
        assert child.stdout is not None
        for line in child.stdout:
            if not self.stopping.is_set():
                sys.stdout.buffer.write(line)
                sys.stdout.flush()

    def wait(self) -> str | None:
        """Until a signal asks to stop (None) or a child ends by itself (its name). A worker
        that ends is started again instead (`_restarted`)."""
        while not self.stopping.wait(0.2):
            for name, child in list(self.children.items()):
                if child.poll() is not None and not self._restarted(name):
                    return name
        return None

    def _restarted(self, name: str) -> bool:
        """Start again a worker that ended by itself (killed, crashed): its episodes go on from
        their last recorded turn under the same worker name. False for any other child, or a
        worker that keeps ending (`WORKER_RESTARTS` within `WORKER_RESTART_WINDOW_SECONDS`):
        that one cannot start, and says why above."""
        if "worker" not in self.commands[name]:
            return False
        now = time.monotonic()
        recent = [
            at for at in self.restarts.get(name, []) if now - at < WORKER_RESTART_WINDOW_SECONDS
        ]
        if len(recent) >= WORKER_RESTARTS:
            return False
        self.restarts[name] = [*recent, now]
        ended = self.children[name]
        # Its pool processes, should any outlive it.
        _signal_group(ended.pid, signal.SIGKILL)
        print(
            f"The {name} stopped unexpectedly (exit status {ended.returncode}); starting it again.",
            flush=True,
        )
        self._spawn(name)
        return True

    def stop(self) -> None:
        self.stopping.set()
        for child in self.children.values():
            _signal_group(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_SECONDS
        for child in self.children.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=max(0.0, deadline - time.monotonic()))
        # A worker that ignored TERM, and pool processes whose parent has gone.
        for child in self.children.values():
            _signal_group(child.pid, signal.SIGKILL)
            child.wait()


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def main() -> int:
    port = os.environ.get("DEMO_PORT", "8000")
    var_dir = Path(os.environ.get("STUDIO_VAR_DIR", BASE_DIR / "var"))
    demo = Demo(port=port, var_dir=var_dir)

    def on_signal(signum: int, frame: object) -> None:
        demo.stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    print(
        f"The studio is on http://127.0.0.1:{port} with two workers (baselines on 2 "
        f"processes, model calls on {MODEL_THREADS} threads) and a scheduler; Ctrl-C stops "
        "them all.",
        flush=True,
    )
    demo.start()
    ended = demo.wait()
    demo.stop()
    held = demo.interrupted()
    if held:
        print(
            f"Interrupted {'; '.join(held)}: the next `make demo` resumes them from their "
            "last recorded turn.",
            flush=True,
        )
    if ended is not None:
        print(f"The {ended} stopped unexpectedly (see above); stopped the others.", flush=True)
        return 1
    print("Stopped the studio, the workers and the scheduler.", flush=True)
    return 0


def jobs_held_lines() -> list[str]:
    """Per job kind, what is held by a worker (in its working status with a claim): its
    count, and for rows of a batch with steps (episodes), the batch and the steps reached."""
    from studio.jobs import job_kinds

    lines = []
    for kind in job_kinds():
        rows = kind.rows() if kind.rows is not None else kind.model.objects.all()
        held = rows.filter(status=kind.working).exclude(claim_token="")
        fields = {field.name for field in kind.model._meta.get_fields()}
        label = kind.model._meta.verbose_name
        if {"batch", "steps"} <= fields:
            by_batch: dict[int, list[int]] = {}
            for batch_id, steps in held.order_by("batch_id", "steps").values_list(
                "batch_id", "steps"
            ):
                by_batch.setdefault(batch_id, []).append(steps)
            for batch_id, steps in by_batch.items():
                lines.append(
                    f"{_count(len(steps), label)} of batch {batch_id} at "
                    f"{'step' if len(steps) == 1 else 'steps'} {_and(steps)}"
                )
        elif count := held.count():
            lines.append(_count(count, label))
    return lines


def _count(n: int, label: str) -> str:
    return f"{n} {label}{'' if n == 1 else 's'}"


def _and(values: list[int]) -> str:
    text = [str(v) for v in values]
    return text[0] if len(text) == 1 else f"{', '.join(text[:-1])} and {text[-1]}"


if __name__ == "__main__":
    sys.exit(main())
