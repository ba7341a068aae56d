"""The studio on S3-compatible storage, against a real S3 API server (moto's, on loopback).

The web (this process) and two Celery workers (child processes) each have their own empty
media folder and one bucket between them: whatever one writes, the others can only have read
through the bucket. Expected values come from the bucket itself (read with boto3) and from
the bytes the tests wrote, never from the studio's own reading code.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from PIL import Image

from conftest import CHAT_KEY_VARIABLE
from curation import services as dataset_services
from curation.export_options import ExportOptions
from curation.jobs import EXPORT
from curation.models import DatasetImport, DatasetVersion
from curation.services_import import dataset_import_create
from probes import runs as probe_runs
from probes.models import ProbeAnswer
from probes.services import probe_set_create
from rollouts.models import Episode, Frame, RolloutBatch, Turn
from rollouts.play import forks
from rollouts.recording import services as recording
from rollouts.review.turn_selection import TurnSelection
from rollouts.rollout_settings import RolloutSettings
from rollouts.tests import openai_server as replies
from studio.testing import (
    JOB_ENDS,
    WORKER_ARGS,
    Child,
    backdate,
    celery_worker_running,
    queue_purge,
    run_command,
    start_python,
    subprocess_env,
    wait_for_row,
)
from tests.s3_server import (  # noqa: F401 (fixtures)
    Bucket,
    _free_port,
    s3_bucket,
    s3_server,
    storages_for,
)
from training.models import TrainingJob
from training.tests.conftest import SYNTH_KEY, fast_training, synth_server  # noqa: F401
from training.tests.test_submit import submit, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

DATA_PNG = re.compile(r"data:image/png;base64,([A-Za-z0-9+/=]+)")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _files_under(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


class Workers:
    """Two `celery -A studio worker` processes, each with its own empty media folder."""

    def __init__(self, bucket: Bucket, extra: dict[str, str]) -> None:
        self.roots = [bucket.media_root(f"worker{n}") for n in (1, 2)]
        self.children: list[Child] = []
        self.bucket, self.extra = bucket, extra

    def env(self, root: Path) -> dict[str, str]:
        return subprocess_env(
            **self.bucket.env,
            STUDIO_MEDIA_ROOT=str(root),
            CELERY_BROKER_URL=os.environ["CELERY_BROKER_URL"],
            **self.extra,
        )

    def start(self) -> Workers:
        for n, root in enumerate(self.roots, start=1):
            self.children.append(self.start_one(root, f"s3-w{n}"))
        return self

    def start_one(self, root: Path, name: str) -> Child:
        return start_python(
            *WORKER_ARGS, "-n", f"{name}@%h", env=self.env(root), quiet=True, own_session=True
        )

    def stop(self) -> None:
        for child in self.children:
            child.kill_all()


@pytest.fixture
def workers(
    s3_bucket,  # noqa: F811 (a fixture, imported above by name)
    chat_endpoint,
    synth_server,  # noqa: F811
    cache_of_its_own,
) -> Iterator[Workers]:
    queue_purge()
    extra = {
        CHAT_KEY_VARIABLE: os.environ[CHAT_KEY_VARIABLE],
        "SYNTH_API_KEY": SYNTH_KEY,
        "STUDIO_CACHE_PREFIX": cache_of_its_own,
    }
    running = Workers(s3_bucket, extra).start()
    yield running
    running.stop()
    queue_purge()


def _model_batch(endpoint, *, seeds: tuple[int, ...], steps: int) -> RolloutBatch:
    batch = recording.batch_create(
        settings=RolloutSettings(
            policy="openai",
            model="test-vlm",
            endpoint=endpoint.name,
            base_url=endpoint.base_url,
            seeds=seeds,
            steps=steps,
            concurrency=2,
            name="on s3",
        )
    )
    wait_for_row(batch, statuses=("finished", "failed", "canceled"), timeout=120)
    assert batch.status == "finished", batch.error
    assert batch.episodes_finished == len(seeds)
    return batch


def _frames_in_bucket(bucket: Bucket) -> dict[str, str]:
    """{sha256 of the object's bytes: key}, every object under frames/ read back."""
    return {_sha(bucket.read(key)): key for key in bucket.keys("frames/")}


def _export(dataset, *, user) -> DatasetVersion:
    version = dataset_services.dataset_version_create(dataset=dataset, created_by=user)
    wait_for_row(version, statuses=JOB_ENDS, timeout=120)
    return version


def _png(color: tuple[int, int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), color).save(buffer, format="PNG")
    return buffer.getvalue()


def test_a_web_and_two_workers_share_one_bucket_and_nothing_else(
    workers,
    s3_bucket,  # noqa: F811 (a fixture, imported above by name)
    chat_server,
    chat_endpoint,
    synth_server,  # noqa: F811
    editor,
    client,
):
    bucket = s3_bucket
    chat_server.default = replies.tool_call("move_right", "do")

    # Recorded on the workers: every frame in the bucket, by its own sha256.
    batch = _model_batch(chat_endpoint, seeds=(3, 4), steps=6)
    recorded = set(Frame.objects.filter(episode__batch=batch).values_list("sha256", flat=True))
    stored = _frames_in_bucket(bucket)
    assert recorded and recorded <= stored.keys()
    assert all(stored[sha] == f"frames/{sha[:2]}/{sha[2:4]}/{sha}.png" for sha in recorded)

    # Reviewed: the viewer and its frames served by the web to a logged-in user only, the
    # bytes the bucket holds, never an address of the bucket.
    episode = batch.episodes.order_by("seed").first()
    turn = Turn.objects.filter(episode=episode).select_related("frame").order_by("index").first()
    frame_url = f"/frames/{turn.frame.sha256}.png"
    assert client.get(frame_url).status_code == 302  # to the login page
    client.force_login(editor)
    page = client.get(f"/episodes/{episode.id}/")
    assert page.status_code == 200
    assert bucket.server.url.encode() not in page.content
    assert b"X-Amz-" not in page.content and bucket.name.encode() not in page.content
    served = client.get(frame_url)
    assert served.status_code == 200 and served["Content-Type"] == "image/png"
    assert served.content == bucket.read(stored[turn.frame.sha256])

    # Forked on a worker: the original's turns replayed from what the bucket holds.
    fork = forks.episode_fork(
        source=episode,
        turn=2,
        settings=forks.fork_settings(
            source=episode,
            settings=RolloutSettings(
                policy="openai",
                model="test-vlm",
                endpoint=chat_endpoint.name,
                base_url=chat_endpoint.base_url,
            ),
            steps=None,
        ),
    )
    wait_for_row(Episode, fork.id, statuses=("finished", "failed"), timeout=120)
    fork.refresh_from_db()
    assert fork.status == "finished", fork.error
    fork_frames = set(Frame.objects.filter(episode=fork).values_list("sha256", flat=True))
    assert fork_frames <= _frames_in_bucket(bucket).keys()

    # Exported on a worker: JSONL and the Hugging Face archive in the bucket, every image in
    # the rows one of the recorded frames.
    dataset = dataset_services.dataset_create(
        name="s3 rows",
        filters=TurnSelection(batches=(batch.id,)),
        options=ExportOptions(val_fraction=0.0),
        created_by=editor,
    )
    version = _export(dataset, user=editor)
    assert version.status == DatasetVersion.Status.DONE, version.error
    jsonl = bucket.read(version.file.name)
    assert _sha(jsonl) == version.sha256 and len(jsonl) == version.bytes
    images = [base64.b64decode(m) for m in DATA_PNG.findall(jsonl.decode())]
    assert len(images) == version.images == Turn.objects.filter(episode__batch=batch).count()
    assert {_sha(image) for image in images} <= recorded
    archive = bucket.read(version.hf_file.name)
    assert _sha(archive) == version.hf_sha256
    downloaded = client.get(f"/datasets/versions/{version.id}/download/?file=hf")
    assert downloaded.status_code == 200
    assert b"".join(downloaded.streaming_content) == archive
    with __import__("zipfile").ZipFile(io.BytesIO(archive)) as zipped:
        assert any(name.endswith(".parquet") for name in zipped.namelist())

    # Submitted for training: the worker builds the upload from the bucket's JSONL.
    outcome = submit("--dataset-version", str(version.id), "--base-url", synth_server.base_url)
    assert outcome.code == 0, outcome.stderr
    job = wait_for(TrainingJob.objects.get(), "succeeded", "failed", timeout=120)
    assert job.status == "succeeded", job.error
    (upload,) = synth_server.uploads.values()
    assert len(upload.rows()) == version.rows
    sent = [base64.b64decode(m) for m in DATA_PNG.findall(upload.content.decode())]
    assert sent and {_sha(image) for image in sent} <= recorded

    # Imported on a worker: a new image lands in the bucket as the exact bytes uploaded.
    new_png = _png((201, 13, 77))
    row = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is here"},
                    {
                        "type": "image_url",
                        "image_url": {
                            "url": "data:image/png;base64," + base64.b64encode(new_png).decode()
                        },
                    },
                ],
            },
            {"role": "assistant", "content": "a tree"},
        ]
    }
    upload_file = SimpleUploadedFile("rows.jsonl", (json.dumps(row) + "\n").encode())
    imported = dataset_import_create(upload=upload_file, name="from elsewhere", created_by=editor)
    wait_for_row(imported, statuses=JOB_ENDS, timeout=120)
    assert imported.status == DatasetImport.Status.DONE, imported.error
    key = f"frames/{_sha(new_png)[:2]}/{_sha(new_png)[2:4]}/{_sha(new_png)}.png"
    assert bucket.read(key) == new_png
    assert not bucket.keys("imports/")  # the upload is removed once imported

    # Probed on the workers: each question's frame read from the bucket.
    chat_server.default = replies.text("A")
    probe_set = probe_set_create(
        filters=TurnSelection(batches=(batch.id,)), kinds=["night", "asleep"], seed=1
    )
    run = probe_runs.probe_run_create(
        probe_set=probe_set, endpoint_name=chat_endpoint.name, model="test-vlm", concurrency=2
    )
    wait_for_row(run, statuses=JOB_ENDS, timeout=120)
    assert run.status == "done", run.error
    assert ProbeAnswer.objects.filter(run=run).count() == probe_set.questions.count() > 0
    probe_images = {
        _sha(base64.b64decode(m))
        for request in chat_server.requests[-probe_set.questions.count() :]
        for m in DATA_PNG.findall(json.dumps(request.body))
    }
    assert probe_images and probe_images <= recorded
    # Exported as question-answer rows, its images read from the bucket.
    probe_rows = s3_bucket.scratch / "probe-rows.jsonl"
    exported = run_command(
        "export_jsonl", "--probe-set", str(probe_set.id), "--output", str(probe_rows)
    )
    assert exported.code == 0, exported.stderr
    probe_exported = [base64.b64decode(m) for m in DATA_PNG.findall(probe_rows.read_text())]
    assert probe_exported and {_sha(image) for image in probe_exported} <= recorded

    # Nothing went through a media folder: each process's stayed empty.
    workers.stop()
    for root in [*workers.roots, Path(str(s3_bucket.scratch / "media-web"))]:
        assert _files_under(root) == [], root


def _scripted_batch(*, seeds: tuple[int, ...], steps: int) -> RolloutBatch:
    """Played here, in the web process: its frames go to the bucket from here."""
    batch = recording.batch_run_inline(
        settings=RolloutSettings(policy="scripted", seeds=seeds, steps=steps, name="scripted")
    )
    assert batch.episodes_finished == len(seeds), batch.error
    return batch


def _parquet_images(folder: Path) -> list[bytes]:
    """Every image's bytes in a Hugging Face dataset's parquet files, read with pyarrow."""
    import pyarrow.parquet as pq

    found: list[bytes] = []

    def walk(value) -> None:
        if isinstance(value, dict):
            if isinstance(value.get("bytes"), bytes):
                found.append(value["bytes"])
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for path in sorted(folder.rglob("*.parquet")):
        walk(pq.read_table(path).to_pylist())
    return found


def test_an_export_killed_mid_way_resumes_byte_identical_from_the_bucket(
    s3_bucket,  # noqa: F811
    editor,
    settings,
    cache_of_its_own,
):
    bucket = s3_bucket
    batch = _scripted_batch(seeds=(1, 2), steps=100)
    recorded = set(Frame.objects.filter(episode__batch=batch).values_list("sha256", flat=True))
    workers = Workers(bucket, {"STUDIO_CACHE_PREFIX": cache_of_its_own})
    dataset = dataset_services.dataset_create(
        name="resumed",
        filters=TurnSelection(batches=(batch.id,)),
        options=ExportOptions(val_fraction=0.0, history_frames=2),
        created_by=editor,
    )
    queue_purge()
    try:
        # A whole export (here, reading only the bucket): what the resumed one must equal.
        whole = dataset_services.dataset_version_create(
            dataset=dataset, created_by=editor, enqueue=False
        )
        assert dataset_services.dataset_version_export(version_id=whole.id) == "done"
        whole.refresh_from_db()

        # The next one's worker, a process of its own, is killed while it exports.
        worker = workers.start_one(workers.roots[0], "s3-killed")
        version = dataset_services.dataset_version_create(dataset=dataset, created_by=editor)
        wait_for_row(version, statuses=("running", *JOB_ENDS), timeout=60, every=0.01)
        worker.kill_all()
        version.refresh_from_db()
        assert version.status == "running"  # killed mid-way, not after
        killed_at = set(bucket.keys("exports/"))

        # Its claim goes stale; the requeue hands it to another worker (threads of this
        # process, whose media folder is empty too).
        backdate(version, field="heartbeat_at", seconds=settings.STUDIO_EXPORT_STALE_SECONDS + 1)
        with celery_worker_running():
            assert EXPORT.requeue() == [version.id]
            wait_for_row(version, statuses=JOB_ENDS, timeout=120)
    finally:
        queue_purge()
    assert version.status == DatasetVersion.Status.DONE, version.error
    resumed = bucket.read(version.file.name)
    assert resumed == bucket.read(whole.file.name)
    assert _sha(resumed) == version.sha256 == whole.sha256
    assert {_sha(base64.b64decode(m)) for m in DATA_PNG.findall(resumed.decode())} <= recorded
    # Nothing but the two versions' files: no partial file or second archive left behind.
    base = f"exports/dataset-{dataset.id}"
    assert bucket.keys("exports/") == sorted(
        f"{base}/v{n}{suffix}" for n in (1, 2) for suffix in (".hf.zip", ".jsonl")
    ), killed_at

    # `export_hf`, its media folder empty: the images in its parquet files are the bucket's
    # frames.
    output = bucket.scratch / "hf-out"
    done = run_command("export_hf", "--output", str(output), "--batch", str(batch.id))
    assert done.code == 0, done.stderr
    images = _parquet_images(output)
    shown = Turn.objects.filter(episode__batch=batch).values_list("frame__sha256", flat=True)
    assert len(images) >= len(shown)
    assert {_sha(image) for image in images} == set(shown)


def test_a_frame_missing_from_the_bucket_is_one_clear_error(
    s3_bucket,  # noqa: F811
    editor,
    client,
):
    bucket = s3_bucket
    batch = _scripted_batch(seeds=(5,), steps=6)
    turn = Turn.objects.filter(episode__batch=batch).select_related("frame").order_by("index")[3]
    key = f"frames/{turn.frame.sha256[:2]}/{turn.frame.sha256[2:4]}/{turn.frame.sha256}.png"
    bucket.delete(key)
    client.force_login(editor)

    missing = client.get(f"/frames/{turn.frame.sha256}.png")
    assert missing.status_code == 404
    assert client.get(f"/episodes/{turn.episode_id}/").status_code == 200

    dataset = dataset_services.dataset_create(
        name="gap",
        filters=TurnSelection(batches=(batch.id,)),
        options=ExportOptions(val_fraction=0.0),
        created_by=editor,
    )
    version = dataset_services.dataset_version_create(
        dataset=dataset, created_by=editor, enqueue=False
    )
    assert dataset_services.dataset_version_export(version_id=version.id) == "failed"
    version.refresh_from_db()
    assert version.error == (
        f"frame file missing from storage: {key}; restore it, or leave its episode out of the"
        " dataset"
    )
    assert not bucket.keys("exports/")


def test_a_bucket_out_of_reach_is_a_503_with_one_line_not_a_500(
    s3_bucket,  # noqa: F811
    editor,
    client,
    settings,
):
    batch = _scripted_batch(seeds=(6,), steps=3)
    turn = Turn.objects.filter(episode__batch=batch).select_related("frame").order_by("index")[1]
    client.force_login(editor)
    assert client.get(f"/frames/{turn.frame.sha256}.png").status_code == 200

    # The same bucket's address, but nothing listens there any more.
    gone = storages_for(s3_bucket, settings.STORAGES)
    gone["default"]["OPTIONS"]["endpoint_url"] = f"http://127.0.0.1:{_free_port()}"
    settings.STORAGES = gone
    answer = client.get(f"/frames/{turn.frame.sha256}.png")
    assert answer.status_code == 503
    assert answer["Retry-After"] == "5"
    name = f"frames/{turn.frame.sha256[:2]}/{turn.frame.sha256[2:4]}/{turn.frame.sha256}.png"
    assert answer.content.decode() == (
        f"frame storage did not answer for {name}; try again in a moment"
    )
