"""A `trl` job trained for real: `submit_training --provider trl`, the submission on a core
worker, the run on a `celery -A studio worker -Q train` process training the tiny Qwen2-VL
with TRL, the beat poll's service following it to a stored model, and the job page drawing
its loss. Both workers are real processes; nothing of ours is replaced.

The helpers here (the tiny model, the config, the workers) serve the other test_trl_ files.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.core.files.storage import default_storage

from studio.testing import ROOT, WORKER_ARGS, Child, queue_purge, run_command, subprocess_env
from training.models import LocalRun, LocalRunEvent, TrainingEvent, TrainingJob
from training.tests.test_submit import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

TRL_TOML = Path(__file__).resolve().parents[1] / "configs" / "crafter_vlm_trl.toml"


def trl_config(
    directory: Path, model: Path, *, max_steps: int, save_steps: int, eval_steps: int = 10
) -> Path:
    """The shipped trl config, with the tiny model and this test's steps; full fine-tuning
    at a learning rate that makes a few dozen steps visibly lower the loss."""
    text = TRL_TOML.read_text()
    replaced = {
        r'(?m)^model = "[^"]*"': f'model = "{model}"',
        r"(?m)^max_steps = \d+": f"max_steps = {max_steps}",
        r"(?m)^save_steps = \d+": f"save_steps = {save_steps}",
        r"(?m)^eval_steps = \d+": f"eval_steps = {eval_steps}",
        r'(?m)^train_kind = "[^"]*"': 'train_kind = "fft"',
        r"(?m)^lora_r = .*\n": "",
        r"(?m)^learning_rate = .*": "learning_rate = 3e-3",
        # One row a step: a CPU step of the tiny model takes about a second.
        r"(?m)^per_device_batch = \d+": "per_device_batch = 1",
    }
    for pattern, value in replaced.items():
        text, count = re.subn(pattern, value, text)
        assert count == 1, pattern
    path = directory / "trl.toml"
    path.write_text(text)
    return path


def worker_env(settings, tmp_path: Path, **extra: str) -> dict[str, str]:
    return subprocess_env(
        CELERY_BROKER_URL=os.environ["CELERY_BROKER_URL"],
        STUDIO_MEDIA_ROOT=str(settings.MEDIA_ROOT),
        STUDIO_MODEL_CACHE_DIR=str(tmp_path / "model-cache"),
        TOKENIZERS_PARALLELISM="false",
        **extra,
    )


def start_worker(
    env: dict[str, str], *, queues: str, name: str, log: Path, prelude: str = ""
) -> Child:
    """`celery -A studio worker -Q <queues>` in a process (and session) of its own, its
    output in `log`; `prelude`: Python run before Celery starts."""
    argv = ["celery", *WORKER_ARGS[2:], "-Q", queues, "-n", f"{name}@%h"]
    code = f"{prelude}\nimport sys\nsys.argv = {argv!r}\nfrom celery.__main__ import main\nmain()"
    out = log.open("w")
    child = Child(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    child.own_session = True
    return child


@contextmanager
def workers(env: dict[str, str], tmp_path: Path, *, train: bool = True) -> Iterator[dict]:
    """A core worker (submissions, cancels) and, with `train`, a train worker."""
    queue_purge()
    started = {"core": start_worker(env, queues="celery", name="core", log=tmp_path / "core.log")}
    if train:
        started["train"] = start_worker(env, queues="train", name="train", log=tmp_path / "t.log")
    try:
        yield started
    finally:
        for child in started.values():
            child.kill_all()
        queue_purge()


def submit_trl(config: Path, version, *more: str) -> TrainingJob:
    outcome = run_command(
        "submit_training",
        "--provider",
        "trl",
        "--config",
        str(config),
        "--dataset-version",
        str(version.id),
        *more,
    )
    assert outcome.code == 0, outcome.stderr
    return TrainingJob.objects.get(id=outcome.summary["job_id"])


def loss_points(job: TrainingJob, column: str) -> list[tuple[int, float]]:
    rows = TrainingEvent.objects.filter(job=job, **{f"{column}__isnull": False})
    return list(rows.order_by("step").values_list("step", column))


def logs(tmp_path: Path) -> str:
    return "\n".join(p.read_text()[-3000:] for p in sorted(tmp_path.glob("*.log")))


def test_it_trains_to_a_stored_model_with_its_loss_on_the_page(
    settings, fast_training, tmp_path, tiny_model, train_version, val_version, client, viewer
):
    config = trl_config(tmp_path, tiny_model, max_steps=24, save_steps=12, eval_steps=8)
    env = worker_env(settings, tmp_path)
    with workers(env, tmp_path):
        job = submit_trl(config, train_version, "--validation-version", str(val_version.id))
        job = wait_for(job, "running", "succeeded", "failed", timeout=120)
        client.force_login(viewer)
        assert client.get(f"/training/{job.id}/").status_code == 200
        job = wait_for(job, "succeeded", "failed", "canceled", timeout=150)
    assert job.status == "succeeded", (job.error, logs(tmp_path))
    assert job.fine_tuned_model == f"trl-job-{job.id}"
    run = LocalRun.objects.get(job=job)
    assert (run.status, run.step, run.total_steps) == ("done", 24, 24)

    train = loss_points(job, "train_loss")
    assert [step for step, _ in train] == list(range(1, 25))
    first, last = train[0][1], sum(loss for _, loss in train[-4:]) / 4
    assert last < first * 0.8, train
    validation = loss_points(job, "validation_loss")
    assert [step for step, _ in validation] == [8, 16, 24]

    # The model is in storage, whole: the manifest the event names, and each file it lists.
    stored = TrainingEvent.objects.get(job=job, type="model_stored")
    sha256 = re.search(r"sha256 ([0-9a-f]{64})", stored.message).group(1)
    assert sha256 == run.model_sha256
    place = stored.data["storage"]
    assert default_storage.exists(f"{place}/manifest.json")
    assert default_storage.exists(f"{place}/config.json")

    page = client.get(f"/training/{job.id}/").content.decode()
    assert f"trl-job-{job.id}" in page
    assert "train loss (24)" in page and "validation loss (3)" in page
    assert 'polyline class="train"' in page
    # Each metric point reached the job once, its step's number of rows.
    assert LocalRunEvent.objects.filter(run=run, kind="metric").count() == 24 + 3
