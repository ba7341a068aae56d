"""The systemd unit that `docs/running-at-scale.md` gives for workers, as far as it can be tried
without systemd running: it restarts the worker whatever ends it, `systemd-analyze verify`
finds nothing to say about it, and its `ExecStart` starts a worker that connects and is ready.
"""

from __future__ import annotations

import configparser
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.faults.stack import ROOT, RedisServer, free_port, studio_env

DOCS = ROOT / "docs" / "running-at-scale.md"
UNIT_NAME = "studio-worker@.service"
# Where the docs install the studio, and where this checkout is.
DOCS_VENV_BIN, DOCS_ROOT = "/srv/studio/.venv/bin", "/srv/studio"


def documented_unit() -> str:
    """The unit's text: the fenced block the docs open with its path as a comment."""
    text = DOCS.read_text()
    found = re.search(
        rf"```ini\n(# /etc/systemd/system/{re.escape(UNIT_NAME)}\n.*?)```", text, re.DOTALL
    )
    assert found, f"no {UNIT_NAME} block in {DOCS}"
    return found.group(1)


def unit_here() -> str:
    """The same unit with this checkout's and this Python's paths."""
    return (
        documented_unit()
        .replace(DOCS_VENV_BIN, str(Path(sys.executable).parent))
        .replace(DOCS_ROOT, str(ROOT))
    )


def sections(unit: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, comment_prefixes=("#",))
    parser.optionxform = str  # systemd's keys are case-sensitive
    parser.read_string(unit)
    return parser


def test_the_documented_unit_restarts_the_worker_whatever_ends_it():
    service = sections(documented_unit())["Service"]
    assert service["Restart"] == "always"
    assert service["ExecStart"].startswith(f"{DOCS_VENV_BIN}/celery -A studio worker ")
    assert float(service["RestartSec"]) <= 5


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_analyze_verify_finds_nothing_to_say(tmp_path):
    (tmp_path / UNIT_NAME).write_text(unit_here())
    done = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / "studio-worker@vlm1.service")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_its_exec_start_starts_a_worker_that_becomes_ready(tmp_path):
    redis = RedisServer(tmp_path / "redis")
    redis.start()
    try:
        service = sections(unit_here())["Service"]
        # As systemd expands it for the instance `vlm1`: %i its name, %% a lone %.
        command = [
            word.replace("%i", "vlm1").replace("%%", "%")
            for word in shlex.split(service["ExecStart"])
        ]
        assert Path(command[0]).exists(), command
        env = studio_env(
            database_url=f"postgres://postgres@127.0.0.1:{free_port()}/nowhere",
            broker_url=redis.url,
            media=tmp_path / "media",
        )
        log = tmp_path / "worker.log"
        with log.open("w") as out:
            worker = subprocess.Popen(
                command,
                cwd=service["WorkingDirectory"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + 120
            while "ready." not in log.read_text(errors="replace"):
                assert worker.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        finally:
            worker.terminate()
            worker.wait(timeout=60)
        said = log.read_text(errors="replace")
        # Its name as celery expanded %h: this host's.
        assert re.search(r"vlm1@\S+ ready\.", said), said
        assert re.search(rf"Connected to redis://\S*127\.0\.0\.1:{redis.port}/0", said), said
    finally:
        redis.stop()
