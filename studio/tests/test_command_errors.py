"""Every command says what went wrong the same way: `NAME: error: MESSAGE` on stderr, one line
per problem, nothing on stdout, exit status non-zero (2 for bad input)."""

from __future__ import annotations

import pytest

from studio.testing import run_command
from studio.tests.test_command_output import project_commands

# A mistake in each command's input, found after its arguments were read (by the command,
# not by argparse), and the line it prints, written out by hand.
MISTAKES: dict[str, tuple[tuple[str, ...], str]] = {
    "batch_report": (("999999",), "batch_report: error: there is no batch 999999"),
    "compare_batches": (("1",), "compare_batches: error: compare at least two batches"),
    "dataset_create": (
        ("--name", "x", "--batch", "999999"),
        "dataset_create: error: batch: there is no batch 999999",
    ),
    "demo_setup": (("--seeds", "1"), "demo_setup: error: unrecognized arguments: --seeds 1"),
    "endpoint": (("--list", "x"), "endpoint: error: --list takes no other argument"),
    "export_hf": (
        ("--output", "/no/such/dir/ds"),
        "export_hf: error: output: directory '/no/such/dir' does not exist",
    ),
    "export_jsonl": (
        ("--output", "/no/such/dir/rows.jsonl"),
        "export_jsonl: error: output: directory '/no/such/dir' does not exist",
    ),
    "fork_episode": (
        ("999999", "--turn", "1", "--policy", "scripted"),
        "fork_episode: error: episode: there is no episode 999999",
    ),
    "import_jsonl": (
        ("/no/such/rows.jsonl",),
        "import_jsonl: error: path: '/no/such/rows.jsonl' is not a file",
    ),
    "probe_run": (
        ("999999", "--endpoint", "local", "--model", "m"),
        "probe_run: error: there is no probe set 999999",
    ),
    "probe_set": (("--per-episode", "0"), "probe_set: error: per-episode: 0 is not at least 1"),
    "rollout": (("--cancel", "999999"), "rollout: error: cancel: there is no batch 999999"),
    "serve_model": (("999999",), "serve_model: error: job: no training job 999999"),
    "submit_training": (
        ("--config", "/no/such/config.toml", "--dataset-version", "1"),
        "submit_training: error: config: cannot read '/no/such/config.toml' (FileNotFoundError)",
    ),
    "training_status": (("999999",), "training_status: error: job: no training job 999999"),
}


def test_every_command_has_a_mistake_to_make():
    assert project_commands() == set(MISTAKES)


@pytest.mark.parametrize("command", sorted(MISTAKES))
def test_a_mistake_is_one_error_line_and_exit_2(command, db):
    argv, line = MISTAKES[command]
    done = run_command(command, *argv)
    assert (done.code, done.stderr, done.stdout) == (2, line + "\n", "")


@pytest.mark.parametrize("command", sorted(MISTAKES))
def test_an_unknown_flag_is_one_error_line_and_exit_2(command, db):
    done = run_command(command, "--no-such-flag")
    assert (done.code, done.stdout) == (2, "")
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"{command}: error: "), line
