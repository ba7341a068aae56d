"""A command run while the database cannot be reached says so in one line (exit status 1),
instead of the driver's traceback."""

from __future__ import annotations

import socket

import pytest

from studio.testing import manage, subprocess_env


def closed_port() -> int:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    "args",
    [
        ("rollout", "--policy", "scripted", "--seeds", "0", "--steps", "3"),
        ("batch_report", "1"),
        ("training_status", "1"),
    ],
)
def test_a_command_without_its_database_says_so_in_one_line(args):
    down = f"postgres://postgres@127.0.0.1:{closed_port()}/studio"
    done = manage(*args, env=subprocess_env(DATABASE_URL=down))
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{args[0]}: error: the database or the task queue is unreachable (")
    assert "run it again once it is back" in lines[0]
    assert "Traceback" not in done.stderr
