"""A `trl` job's checkpoints and trained model on an S3 bucket (moto's server, on loopback).

Every process (the web here, a core worker, the train workers, a process fetching the model)
has its own empty media folder and its own empty model cache: the bucket is the only thing
they share. Expected values come from the bucket itself, read with boto3, and from zipfile
and hashlib, never from `training.model_store`'s own reading.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from studio.jobs import jobs_requeue
from studio.testing import Child, backdate, queue_purge, run_python, subprocess_env, wait_until
from tests.s3_server import Bucket, s3_bucket, s3_server  # noqa: F401 (fixtures)
from training import model_store
from training.models import LocalRun, TrainingEvent, TrainingJob
from training.tests.conftest import fast_training, tiny_model, version_of  # noqa: F401
from training.tests.test_submit import wait_for
from training.tests.test_trl_train import start_worker, submit_trl, trl_config

pytestmark = pytest.mark.django_db(transaction=True)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _files_under(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


class Processes:
    """Each child process's own empty media folder and model cache, and its log."""

    def __init__(self, bucket: Bucket, cache_prefix: str) -> None:
        self.bucket, self.cache_prefix = bucket, cache_prefix
        self.roots: dict[str, Path] = {}
        self.caches: dict[str, Path] = {}
        self.children: dict[str, Child] = {}

    def env(self, who: str) -> dict[str, str]:
        self.roots[who] = self.bucket.media_root(who)
        self.caches[who] = self.bucket.scratch / f"model-cache-{who}"
        return subprocess_env(
            **self.bucket.env,
            CELERY_BROKER_URL=os.environ["CELERY_BROKER_URL"],
            STUDIO_MEDIA_ROOT=str(self.roots[who]),
            STUDIO_MODEL_CACHE_DIR=str(self.caches[who]),
            STUDIO_CACHE_PREFIX=self.cache_prefix,
            TOKENIZERS_PARALLELISM="false",
        )

    def worker(self, who: str, queues: str) -> Child:
        log = self.bucket.scratch / f"{who}.log"
        self.children[who] = start_worker(self.env(who), queues=queues, name=who, log=log)
        return self.children[who]

    def logs(self) -> str:
        return "\n".join(p.read_text()[-3000:] for p in sorted(self.bucket.scratch.glob("*.log")))

    def stop(self) -> None:
        for child in self.children.values():
            child.kill_all()


@pytest.fixture
def processes(s3_bucket, cache_of_its_own, fast_training) -> Iterator[Processes]:  # noqa: F811
    queue_purge()
    running = Processes(s3_bucket, cache_of_its_own)
    yield running
    running.stop()
    queue_purge()


@pytest.fixture
def web_cache(settings, s3_bucket) -> Path:  # noqa: F811
    settings.STUDIO_MODEL_CACHE_DIR = s3_bucket.scratch / "model-cache-web"
    return settings.STUDIO_MODEL_CACHE_DIR


@pytest.fixture
def bucket_version(s3_bucket, web_cache):  # noqa: F811
    """Played and exported here, after the web's storage became the bucket."""
    version = version_of(seeds=(1,), steps=12, name="crafter on s3")
    assert version.hf_file.name in s3_bucket.keys("exports/")
    return version


@contextmanager
def _training(processes: Processes, *, train_as: str = "train") -> Iterator[Processes]:
    processes.worker("core", "celery")
    processes.worker(train_as, "train")
    try:
        yield processes
    finally:
        processes.stop()


FETCH = """
import json, os, sys
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")
django.setup()
from training import model_store
try:
    path = model_store.model_fetch(int(sys.argv[1]))
except model_store.ModelStoreError as exc:
    print(json.dumps({"error": str(exc)}))
    sys.exit(3)
print(json.dumps({"path": str(path)}))
"""


def _fetch_elsewhere(processes: Processes, who: str, job_id: int) -> tuple[int, dict]:
    """`model_fetch` in a process of its own, with an empty cache and media folder."""
    done = run_python("-c", FETCH, str(job_id), env=processes.env(who))
    lines = done.stdout.strip().splitlines()
    assert lines, (done.returncode, done.stderr[-3000:])
    return done.returncode, json.loads(lines[-1])


def _bucket_manifest(bucket: Bucket, job_id: int) -> tuple[bytes, dict]:
    body = bucket.read(f"{model_store.job_prefix(job_id)}/model/manifest.json")
    return body, json.loads(body)["files"]


def _zip_contents(data: bytes) -> dict[str, str]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {
            info.filename: _sha(archive.read(info))
            for info in archive.infolist()
            if not info.is_dir()
        }


def _dir_contents(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): _sha(p.read_bytes())
        for p in folder.rglob("*")
        if p.is_file() and p.name != ".last-used"
    }


def test_a_trained_model_and_its_checkpoint_live_in_the_bucket_and_are_fetched_checked(
    s3_bucket,  # noqa: F811
    processes,
    bucket_version,
    tiny_model,  # noqa: F811
    web_cache,
):
    bucket = s3_bucket
    config = trl_config(bucket.scratch, tiny_model, max_steps=12, save_steps=6)
    with _training(processes):
        job = submit_trl(config, bucket_version)
        job = wait_for(job, "succeeded", "failed", "canceled", timeout=180)
    assert job.status == "succeeded", (job.error, processes.logs())
    run = LocalRun.objects.get(job=job)
    prefix = model_store.job_prefix(job.id)

    # The last checkpoint, a zip of the Trainer's checkpoint directory, is in the bucket.
    checkpoints = bucket.keys(f"{prefix}/checkpoints/")
    assert checkpoints == [f"{prefix}/checkpoints/step-00000012.zip"], checkpoints
    assert "trainer_state.json" in _zip_contents(bucket.read(checkpoints[0]))
    assert TrainingEvent.objects.filter(job=job, type="checkpoint").count() >= 1

    # The model: every file the manifest lists, with its bytes' sha256, and nothing else.
    body, manifest = _bucket_manifest(bucket, job.id)
    assert _sha(body) == run.model_sha256
    model_keys = bucket.keys(f"{prefix}/model/")
    assert model_keys == sorted(
        [f"{prefix}/model/manifest.json"] + [f"{prefix}/model/{name}" for name in manifest]
    )
    assert {"config.json", "model.safetensors"} <= manifest.keys()
    for name, entry in manifest.items():
        data = bucket.read(f"{prefix}/model/{name}")
        assert (_sha(data), len(data)) == (entry["sha256"], entry["bytes"]), name

    # The train worker read the export from the bucket into its own cache, under the sha256
    # of the bucket's bytes, unzipped whole and nothing else (the run's own tables go to its
    # work folder).
    archive = bucket.read(bucket_version.hf_file.name)
    entry = processes.caches["train"] / f"dataset-{_sha(archive)}"
    assert entry.is_dir(), sorted(p.name for p in processes.caches["train"].iterdir())
    assert _zip_contents(archive) == _dir_contents(entry)

    # Nothing went through a media folder: each process's stayed empty.
    for root in [*processes.roots.values(), bucket.scratch / "media-web"]:
        assert _files_under(root) == [], root

    # Another process, its cache empty, fetches the model: the manifest's bytes.
    code, answer = _fetch_elsewhere(processes, "fetcher", job.id)
    assert code == 0, answer
    fetched = Path(answer["path"])
    assert fetched.is_relative_to(processes.caches["fetcher"])
    assert _dir_contents(fetched) == {name: e["sha256"] for name, e in manifest.items()}

    # A file altered in the bucket (same length, one byte changed) is one clear error.
    key = f"{prefix}/model/config.json"
    original = bucket.read(key)
    altered = original[:-2] + bytes([original[-2] ^ 0x01]) + original[-1:]
    bucket.server.client().put_object(Bucket=bucket.name, Key=key, Body=altered)
    code, answer = _fetch_elsewhere(processes, "fetcher2", job.id)
    assert code == 3, answer
    error = answer["error"]
    assert "'config.json'" in error and "does not match its manifest" in error, error
    assert "\n" not in error
    assert not [p for p in processes.caches["fetcher2"].iterdir() if not p.name.startswith(".")]
    assert _files_under(processes.roots["fetcher2"]) == []


STEPS, SAVE = 24, 8


def test_a_killed_train_worker_is_resumed_from_the_bucket_by_another_with_nothing_local(
    s3_bucket,  # noqa: F811
    processes,
    bucket_version,
    tiny_model,  # noqa: F811
    settings,
):
    bucket = s3_bucket
    config = trl_config(bucket.scratch, tiny_model, max_steps=STEPS, save_steps=SAVE)
    with _training(processes, train_as="train1"):
        job = submit_trl(config, bucket_version)
        # Past the first checkpoint in the bucket, before the second.
        run = wait_until(
            lambda: LocalRun.objects.filter(
                job=job, checkpoint_step=SAVE, step__gte=SAVE + 2
            ).first(),
            timeout=150,
            every=0.05,
            what=lambda: f"a checkpoint and two steps more; logs:\n{processes.logs()}",
        )
        processes.children["train1"].kill_all()
        killed_at = LocalRun.objects.get(id=run.id).step
        assert SAVE < killed_at < STEPS
        prefix = model_store.job_prefix(job.id)
        assert bucket.keys(f"{prefix}/checkpoints/") == [
            f"{prefix}/checkpoints/step-{SAVE:08d}.zip"
        ]

        # Once its claim is stale, the requeue sends it to a worker with nothing of the
        # first's: another empty media folder and model cache.
        backdate(run, field="heartbeat_at", seconds=settings.STUDIO_TRAINING_RUN_STALE_SECONDS + 1)
        assert jobs_requeue()["training_local_run"] == 1
        processes.worker("train2", "train")
        job = wait_for(job, "succeeded", "failed", "canceled", timeout=180)
    assert job.status == "succeeded", (job.error, processes.logs())
    run.refresh_from_db()
    assert run.attempts == 2 and run.step == STEPS
    resumed = list(
        TrainingEvent.objects.filter(job=job, type="resumed").values_list("message", flat=True)
    )
    assert f"resumed from step {SAVE}" in resumed, resumed
    train_steps = TrainingEvent.objects.filter(job=job, train_loss__isnull=False)
    assert sorted(train_steps.values_list("step", flat=True)) == list(range(1, STEPS + 1))

    # The second worker fetched the export itself, and the model it stored is whole.
    archive = bucket.read(bucket_version.hf_file.name)
    assert (processes.caches["train2"] / f"dataset-{_sha(archive)}").is_dir()
    body, manifest = _bucket_manifest(bucket, job.id)
    assert _sha(body) == run.model_sha256
    for name, entry in manifest.items():
        assert _sha(bucket.read(f"{prefix}/model/{name}")) == entry["sha256"], name
    assert bucket.keys(f"{prefix}/checkpoints/") == [f"{prefix}/checkpoints/step-{STEPS:08d}.zip"]
    for root in [*processes.roots.values(), bucket.scratch / "media-web"]:
        assert _files_under(root) == [], root
    assert TrainingJob.objects.get(id=job.id).fine_tuned_model == f"trl-job-{job.id}"
