"""No command lets a control character from outside reach the terminal: a model name, a
provider's error, a file's name or content, a dataset's name. Every command of the project
is run with such a value in each field it prints; a command added without a case here fails
`test_every_command_has_a_case`."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.core.management import get_commands, load_command_class

from curation.models import Dataset, DatasetVersion
from rollouts.management.commands.demo_setup import DEMO_BATCH_NAME
from rollouts.models import Episode, RolloutBatch
from rollouts.tests import openai_server as replies
from rollouts.tests.helpers import record_batch
from studio.commands import StudioCommand
from studio.models import Endpoint
from studio.testing import manage, run_command, subprocess_env
from training.models import TrainingEvent, TrainingJob

# An OSC that retitles the window (ended by BEL), a CSI that clears the screen, the one-byte
# C1 CSI, a carriage return that rewrites the line, and DEL: each acts on a terminal.
HOSTILE = "ft:model\x1b]0;PWNED\x07\x1b[2J\x9b31m\rover\x7f"
# What must be seen, escaped, where the hostile value is printed (the case prints the field).
MARK = "PWNED"
# Every C0 control but the newline, DEL, every C1.
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")


class World:
    """The objects the cases print, each carrying the hostile value where a user, a model, a
    provider or a file would put it."""

    def __init__(self, tmp_path: Path, chat_server: Any) -> None:
        self.tmp_path = tmp_path
        self.chat_server = chat_server
        # A folder whose very name is hostile (a file name is text from a user).
        self.folder = tmp_path / f"in{HOSTILE}"
        self.folder.mkdir()

    def model_batch(self) -> RolloutBatch:
        batch = RolloutBatch.objects.create(
            policy="openai", model=HOSTILE, name=HOSTILE, seeds=[1, 2]
        )
        for seed in (1, 2):
            Episode.objects.create(batch=batch, seed=seed, status="finished", steps=3)
        return batch

    def scripted_batch(self) -> RolloutBatch:
        return record_batch(policy="scripted", seeds=(0,), steps=6)

    def failing_server(self) -> str:
        """The chat endpoint refuses every call (the model unknown to it), its error's text
        hostile: the episode fails with that text."""
        self.chat_server.default = replies.status(404, message=HOSTILE)
        return self.chat_server.url

    def training_job(self) -> TrainingJob:
        dataset = Dataset.objects.create(name=HOSTILE)
        version = DatasetVersion.objects.create(dataset=dataset, number=1)
        job = TrainingJob.objects.create(
            dataset_version=version,
            base_url="http://127.0.0.1:9/api",
            model=HOSTILE,
            config_toml="",
            idempotency_key=uuid.uuid4().hex,
            status=TrainingJob.Status.FAILED,
            remote_job_id=HOSTILE,
            fine_tuned_model=HOSTILE,
            error=HOSTILE,
        )
        TrainingEvent.objects.create(
            job=job, remote_id="e1", time="2026-01-01T00:00:00Z", message=HOSTILE
        )
        return job

    def probe_set_id(self) -> int:
        batch = self.scripted_batch()
        made = run_command("probe_set", "--batch", str(batch.id), "--per-episode", "2")
        assert made.code == 0, made.stderr
        return made.summary["set_id"]


Output = tuple[str, str]  # stdout, stderr


def _run(*argv: Any) -> Output:
    done = run_command(*(str(a) for a in argv))
    return done.stdout, done.stderr


def _batch_report(world: World) -> list[Output]:
    batch = world.model_batch()
    return [
        _run("batch_report", batch.id),
        _run("batch_report", batch.id, "--json"),
        _run("batch_report", HOSTILE),  # the parser's error quotes it
    ]


def _compare_batches(world: World) -> list[Output]:
    one, two = world.model_batch(), world.model_batch()
    return [
        _run("compare_batches", one.id, two.id),
        _run("compare_batches", one.id, two.id, "--json"),
    ]


def _rollout(world: World) -> list[Output]:
    url = world.failing_server()
    played = ("--policy", "openai", "--model", HOSTILE, "--seeds", "0", "--steps", "2")
    return [
        _run("rollout", *played, "--base-url", url, "--inline"),
        _run("rollout", "--policy", HOSTILE),
    ]


def _fork_episode(world: World) -> list[Output]:
    source = world.scripted_batch().episodes.get()
    url = world.failing_server()
    return [
        _run(
            "fork_episode",
            source.id,
            "--turn",
            "2",
            "--policy",
            "openai",
            "--model",
            HOSTILE,
            "--base-url",
            url,
            "--inline",
        )
    ]


def _demo_setup(world: World) -> list[Output]:
    # Its endpoint's URL comes from the environment, read when the module loads: a process
    # of its own. With the demo batch there already, it records nothing.
    RolloutBatch.objects.create(policy="scripted", name=DEMO_BATCH_NAME, seeds=[0])
    env = subprocess_env(DEMO_MODEL_URL=HOSTILE, DEMO_PASSWORD="demo-password-for-a-test")
    done = manage("demo_setup", env=env)
    assert done.returncode == 0, done.stderr
    return [(done.stdout, done.stderr)]


def _export_jsonl(world: World) -> list[Output]:
    batch = world.scripted_batch()
    output = world.folder / f"rows{HOSTILE}.jsonl"
    return [
        _run("export_jsonl", "--output", output, "--batch", batch.id),
        _run("export_jsonl", "--output", output, "--batch", batch.id),  # exists: refused
        _run("export_jsonl", "--output", world.folder / HOSTILE / "rows.jsonl"),
    ]


def _export_hf(world: World) -> list[Output]:
    (world.folder / "notes.txt").write_text("mine\n")
    return [
        _run("export_hf", "--output", world.folder),
        _run("export_hf", "--output", world.folder / HOSTILE / "dataset"),
    ]


def _import_jsonl(world: World) -> list[Output]:
    path = world.folder / "rows.jsonl"
    row = {"messages": [{"role": HOSTILE, "content": HOSTILE}]}
    path.write_text(json.dumps(row, ensure_ascii=False) + "\n", encoding="utf-8")
    return [
        _run("import_jsonl", path),
        _run("import_jsonl", world.folder / f"missing{HOSTILE}.jsonl"),
    ]


def _submit_training(world: World) -> list[Output]:
    config = world.folder / "config.toml"
    escaped = HOSTILE.encode("unicode_escape").decode().replace("\\x", "\\u00")
    config.write_text(f'[job]\nmodel = "{escaped}"\n"{escaped}" = 1\n', encoding="utf-8")
    # A dataset with no version yet: its config is checked before anything is exported.
    dataset = Dataset.objects.create(name=HOSTILE)
    return [
        _run("submit_training", "--config", config, "--dataset", dataset.id),
        _run("submit_training", "--config", world.folder / "nope.toml", "--dataset", dataset.id),
    ]


def _training_status(world: World) -> list[Output]:
    return [_run("training_status", world.training_job().id)]


def _serve_model(world: World) -> list[Output]:
    job = world.training_job()
    TrainingJob.objects.filter(id=job.id).update(provider="trl", status="succeeded")
    return [_run("serve_model", job.id, "--endpoint", HOSTILE)]


def _probe_set(world: World) -> list[Output]:
    batch = world.scripted_batch()
    return [_run("probe_set", "--batch", batch.id, "--kinds", HOSTILE)]


def _probe_run(world: World) -> list[Output]:
    set_id = world.probe_set_id()
    return [
        _run("probe_run", set_id, "--endpoint", HOSTILE, "--model", HOSTILE, "--inline"),
        _run("probe_run", set_id, "--endpoint", HOSTILE, "--model", "m", "--observation", HOSTILE),
    ]


def _endpoint(world: World) -> list[Output]:
    # Written past the admin's checks (an older row, a database edited by hand): listed escaped.
    Endpoint.objects.create(name="hostile", base_url=f"http://127.0.0.1:9/{HOSTILE}")
    return [_run("endpoint", "--list")]


def _dataset_create(world: World) -> list[Output]:
    batch = world.scripted_batch()
    return [_run("dataset_create", "--name", "x", "--batch", batch.id, "--model", HOSTILE)]


CASES: dict[str, Callable[[World], list[Output]]] = {
    "dataset_create": _dataset_create,
    "endpoint": _endpoint,
    "batch_report": _batch_report,
    "compare_batches": _compare_batches,
    "demo_setup": _demo_setup,
    "export_hf": _export_hf,
    "export_jsonl": _export_jsonl,
    "fork_episode": _fork_episode,
    "import_jsonl": _import_jsonl,
    "probe_run": _probe_run,
    "probe_set": _probe_set,
    "rollout": _rollout,
    "serve_model": _serve_model,
    "submit_training": _submit_training,
    "training_status": _training_status,
}


def project_commands() -> set[str]:
    """The management commands of this project's apps (not Django's, not a library's)."""
    ours = {c.name for c in apps.get_app_configs() if "site-packages" not in c.path}
    ours -= {c.name for c in apps.get_app_configs() if c.name.startswith("django.")}
    return {name for name, app in get_commands().items() if app in ours}


def test_every_command_has_a_case():
    assert project_commands() == set(CASES)


def test_every_command_prints_through_the_one_writer():
    """StudioCommand's stdout and stderr are where the escaping happens."""
    commands = get_commands()
    plain = [
        name
        for name in project_commands()
        if not isinstance(load_command_class(commands[name], name), StudioCommand)
    ]
    assert plain == []


@pytest.mark.parametrize("command", sorted(CASES))
def test_no_control_character_from_outside_reaches_the_terminal(
    command, transactional_db, tmp_path, chat_server
):
    outputs = CASES[command](World(tmp_path, chat_server))
    for stdout, stderr in outputs:
        shown = stdout + stderr
        assert MARK in shown, f"{command} did not print the hostile value: {shown!r}"
        assert RAW_CONTROL.findall(shown) == [], f"{command} printed {shown!r}"
