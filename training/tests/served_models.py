"""What the serving tests share: a tiny model that answers one known text, and a succeeded
trl job whose stored model `manage.py serve_model` serves for a whole test module.

A random tiny model answers noise, which shows what the studio records of an unusable
answer but never whether a good one is read. `answering_tiny_vlm` makes a tiny Qwen2-VL
that answers the same token chain whatever it is shown: its text layers add nothing to the
residual stream (attention and MLP outputs zeroed), so the next token depends on the last
one alone, and the output head maps each token of the chain to the one after it. The
prompt always ends with the newline after `<|im_start|>assistant`, where the chain starts.
The engine, the chat template, the processor and the image path are all the real ones.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.test import override_settings

from curation.models import Dataset, DatasetVersion
from studio.models import Endpoint
from studio.testing import Child, start_python, subprocess_env
from training import model_store
from training.models import TrainingJob
from training.open_models.tiny import build_tiny_vlm

# The studio's tool call, as one token of the tiny model's vocabulary.
MOVE_LEFT_CALL = '{"name": "interact_many", "arguments": {"actions": ["move_left"]}}'


def answering_tiny_vlm(directory: Path, chain: list[str]) -> Path:
    """A tiny Qwen2-VL whose every answer is the tokens `chain` (texts, each added to the
    vocabulary unless it is a token already), then the end of its turn."""
    import torch
    from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

    build_tiny_vlm(directory)
    processor = AutoProcessor.from_pretrained(directory)
    tokenizer = processor.tokenizer
    known = tokenizer.get_vocab()
    tokenizer.add_tokens([text for text in chain if text not in known])
    ids = [tokenizer.convert_tokens_to_ids("\u010a")]  # byte-level "\n": the prompt's last token
    assert tokenizer.decode(ids) == "\n"
    ids += [tokenizer.convert_tokens_to_ids(text) for text in chain]
    ids.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    assert len(set(ids)) == len(ids), "each token of the chain once: the next follows the last"
    model = Qwen2VLForConditionalGeneration.from_pretrained(directory)
    model.resize_token_embeddings(len(tokenizer))
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert embed.data_ptr() != head.data_ptr()
    hidden = embed.shape[1]
    assert len(ids) <= hidden
    with torch.no_grad():
        for name, module in model.named_modules():
            if "language_model" in name and name.endswith(("o_proj", "down_proj")):
                module.weight.zero_()
                if module.bias is not None:
                    module.bias.zero_()
        head.zero_()
        for position, token in enumerate(ids[:-1]):
            embed[token] = 0.0
            embed[token, position] = 1.0
            head[ids[position + 1], position] = 50.0
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def descendants(pid: int) -> set[int]:
    """Every live process under `pid`, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@dataclass
class ServedJob:
    """A succeeded trl job, its model stored, served by `serve_model` in a child process."""

    job: TrainingJob
    port: int
    child: Child
    lines: list[str] = field(default_factory=list)
    _lines: queue.Queue = field(default_factory=queue.Queue)

    @property
    def model(self) -> str:
        return self.job.fine_tuned_model

    def endpoint(self) -> Endpoint:
        return Endpoint.objects.get(name=self.model)

    def wait_line(self, timeout: float) -> str:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"serve_model printed nothing in {timeout} s") from None
        if line is None:
            raise AssertionError(f"serve_model exited: {self.child.wait()} {self.lines}")
        return line

    def stop(self, timeout: float = 60) -> int:
        if self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)
        return self.child.wait(timeout=timeout)


def trl_job(*, status: str = "succeeded") -> TrainingJob:
    """A trl job row as the trl provider leaves a trained one (its model named after it)."""
    dataset = Dataset.objects.create(name=f"served {uuid.uuid4().hex[:6]}")
    version = DatasetVersion.objects.create(dataset=dataset, number=1)
    job = TrainingJob.objects.create(
        dataset_version=version,
        provider="trl",
        base_url="",
        model="tiny-qwen2-vl",
        config_toml="",
        idempotency_key=uuid.uuid4().hex,
        remote_job_id="local",
        status=status,
    )
    if status == "succeeded":
        TrainingJob.objects.filter(id=job.id).update(fine_tuned_model=f"trl-job-{job.id}")
        job.refresh_from_db()
    return job


def serve_job(job: TrainingJob, *, media: Path, cache: Path) -> ServedJob:
    """`manage.py serve_model JOB` started on a free port, its stdout read line by line."""
    port = free_port()
    env = subprocess_env(
        STUDIO_MEDIA_ROOT=str(media), STUDIO_MODEL_CACHE_DIR=str(cache), STUDIO_S3_BUCKET=""
    )
    child = start_python(
        "manage.py", "serve_model", str(job.id), "--port", str(port), "--device", "cpu", env=env
    )
    served = ServedJob(job=job, port=port, child=child)

    def read() -> None:
        for line in child.stdout:
            served.lines.append(line.rstrip("\n"))
            served._lines.put(line.rstrip("\n"))
        served._lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    # Drained, or a full pipe would stop the child mid-write.
    threading.Thread(target=child.stderr.read, daemon=True).start()
    return served


def store_model(job: TrainingJob, model_dir: Path) -> str:
    return model_store.model_upload(job.id, model_dir)


def wait_gone(pids: set[int], timeout: float = 30) -> set[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = {pid for pid in pids if alive(pid)}
        if not left:
            return left
        time.sleep(0.2)
    return {pid for pid in pids if alive(pid)}


@contextmanager
def served_for_module(django_db_blocker, root: Path, chain: list[str]) -> Iterator[ServedJob]:
    """A trl job answering `chain`, stored and served by `serve_model` (not yet waited
    for); its rows, committed outside the tests' transactions, removed after."""
    media = root / "media"
    storage = {"BACKEND": "django.core.files.storage.FileSystemStorage"}
    with (
        django_db_blocker.unblock(),
        override_settings(
            STORAGES={
                **settings.STORAGES,
                "default": {**storage, "OPTIONS": {"location": str(media)}},
            },
            STUDIO_MODEL_CACHE_DIR=root / "cache-here",
        ),
    ):
        job = trl_job()
        store_model(job, answering_tiny_vlm(root / "model", chain))
        server = serve_job(job, media=media, cache=root / "cache-served")
        try:
            yield server
        finally:
            server.stop()
            Endpoint.objects.filter(name=job.fine_tuned_model).delete()
            version = job.dataset_version
            job.delete()
            version.delete()
            version.dataset.delete()


def ready(served: ServedJob, timeout: float = 240) -> ServedJob:
    """The served job once `serve_model` said it serves."""
    line = served.lines[0] if served.lines else served.wait_line(timeout=timeout)
    assert line.startswith("Serving trl-job-"), served.lines
    return served
