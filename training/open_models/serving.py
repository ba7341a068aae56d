"""A trl job's trained model served by an existing engine, as an admin endpoint.

`serve_model JOB` fetches the model (training.model_store, checked against its manifest),
starts vLLM where it is installed and CUDA is present, else `transformers serve`, as a child
process in a session of its own, waits until it answers, and names it as a chat endpoint
whose one allowed model is the job's `fine_tuned_model`. Evaluate, `rollout` and
`probe_run` then call it as any endpoint. Stopping the command stops the engine and
everything it started.

Nothing heavy is imported here: the engine is another process, found by `importlib`.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from django.core.exceptions import ValidationError
from django.core.validators import validate_slug

from studio.endpoints import endpoint_described, endpoint_save
from studio.models import Endpoint
from training import model_store
from training.models import TrainingJob

ENGINES = ("auto", "vllm", "transformers")
DEVICES = ("cpu", "auto")
# A real model loads for minutes (weights read, CUDA graphs built); the tiny one in seconds.
READY_SECONDS = 900.0
STOP_SECONDS = 20.0
# /v1/models of an engine: a short list; more than this is not an answer worth reading.
MODELS_ANSWER_MAX_BYTES = 1 << 20


class ServingError(ValueError):
    """The job cannot be served as asked; the message says why in one line."""


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    engine: str = "auto"
    endpoint: str = ""
    device: str = "auto"


@dataclass(frozen=True)
class Launch:
    """An engine's command line, where it runs, and the model name it answers to."""

    engine: str
    argv: list[str]
    cwd: Path
    model: str


def served_job(job_id: int) -> TrainingJob:
    """The job, if it is a succeeded trl job with a model; ServingError saying why not."""
    job = TrainingJob.objects.filter(id=job_id).first()
    if job is None:
        raise ServingError(f"job: no training job {job_id}")
    if job.provider != "trl":
        raise ServingError(
            f"job: training job {job_id} was trained by {job.provider!r}, not trl: "
            "its model lives with that provider"
        )
    if job.status != TrainingJob.Status.SUCCEEDED or not job.fine_tuned_model:
        raise ServingError(f"job: training job {job_id} has no trained model yet ({job.status})")
    return job


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _cuda_present() -> bool:
    # Asked of a child: importing torch here would make every `manage.py` pay for it.
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:
        return subprocess.run([sys.executable, "-c", probe], timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def engine_choose(requested: str, device: str) -> str:
    """The engine `requested` names, or for auto the best one installed here."""
    vllm = bool(shutil.which("vllm")) or _installed("vllm")
    transformers_serve = all(_installed(m) for m in ("transformers", "fastapi", "uvicorn"))
    if requested == "vllm":
        if not vllm:
            raise ServingError("engine: vLLM is not installed here (pip install vllm)")
        return "vllm"
    if requested == "auto" and vllm and device != "cpu" and _cuda_present():
        return "vllm"
    if not transformers_serve:
        raise ServingError(
            "engine: no serving engine is installed here: install vLLM (with CUDA) or the "
            "`.[train]` extra for `transformers serve`"
        )
    return "transformers"


def _adapter_base(model_dir: Path) -> str | None:
    """The base model a LoRA adapter directory names, or None for a whole model."""
    config = model_dir / "adapter_config.json"
    if not config.is_file():
        return None
    try:
        base = json.loads(config.read_text(encoding="utf-8"))["base_model_name_or_path"]
    except (ValueError, KeyError, TypeError, OSError) as exc:
        raise ServingError(f"model: {config.name} names no base model") from exc
    if not isinstance(base, str) or not base:
        raise ServingError(f"model: {config.name} names no base model")
    return base


def engine_launch(
    engine: str, model_dir: Path, name: str, options: ServeOptions, workdir: Path
) -> Launch:
    """The command line of `engine` serving `model_dir` under the model name `name`."""
    address = ["--host", options.host, "--port", str(options.port)]
    if engine == "vllm":
        base = _adapter_base(model_dir)
        if base is None:
            argv = ["vllm", "serve", str(model_dir), "--served-model-name", name]
        else:
            # vLLM serves the base model under its own name and the adapter under `name`.
            argv = ["vllm", "serve", base, "--enable-lora", "--lora-modules"]
            argv.append(f"{name}={model_dir}")
        return Launch(engine, argv + address, workdir, name)
    # `transformers serve MODEL` answers only requests for the name it was given, and
    # reports that name: a link called `name` in its working directory makes it the job's.
    (workdir / name).symlink_to(model_dir, target_is_directory=True)
    argv = [sys.executable, "-m", "transformers.cli.transformers", "serve", name]
    argv += ["--device", options.device, "--log-level", "warning", *address]
    return Launch(engine, argv, workdir, name)


def _die_with_parent() -> None:
    """In the child before it runs: a serve_model killed outright still stops its engine."""
    with contextlib.suppress(Exception):
        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def engine_start(launch: Launch, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            launch.argv,
            cwd=launch.cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )


def engine_stop(process: subprocess.Popen) -> None:
    """SIGTERM to the engine's whole session, then SIGKILL to what is left of it."""
    for stop, wait in ((signal.SIGTERM, STOP_SECONDS), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, stop)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=wait)
        if _session_gone(process.pid):
            return


def _session_gone(sid: int) -> bool:
    try:
        os.killpg(sid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _models_listed(base_url: str) -> list[str]:
    # Straight to the engine: a proxy of the environment has no business between them.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{base_url}/models", timeout=5) as answer:
        body = json.loads(answer.read(MODELS_ANSWER_MAX_BYTES))
    return [str(entry.get("id")) for entry in body.get("data", []) if isinstance(entry, dict)]


def engine_wait_ready(
    process: subprocess.Popen, base_url: str, model: str, log: Path, timeout: float
) -> None:
    """Until the engine lists `model` at /v1/models; ServingError if it exits or never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServingError(
                f"engine: it exited with status {process.returncode} before answering; "
                f"its output: {log}\n{_log_tail(log)}"
            )
        with contextlib.suppress(OSError, ValueError, AttributeError):
            if model in _models_listed(base_url):
                return
        time.sleep(0.5)
    raise ServingError(f"engine: not answering at {base_url} after {timeout:.0f} s; see {log}")


def _log_tail(log: Path, lines: int = 15) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    return ""


def base_url_of(host: str, port: int) -> str:
    """The URL workers reach the engine at: a wildcard address is this machine's name."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/v1"


def endpoint_name_for(job: TrainingJob, requested: str) -> str:
    """The endpoint's name, checked before anything starts: a slug, and not the name of an
    endpoint of another kind (a training provider's, which this must not overwrite)."""
    name = requested or f"trl-job-{job.id}"
    try:
        validate_slug(name)
    except ValidationError as exc:
        raise ServingError(f"endpoint: {name!r} is not a name (letters, digits, - and _)") from exc
    if len(name) > Endpoint._meta.get_field("name").max_length:
        raise ServingError(f"endpoint: {name!r} is longer than an endpoint's name may be")
    other = Endpoint.objects.filter(name=name).exclude(kind=Endpoint.Kind.CHAT).first()
    if other is not None:
        raise ServingError(f"endpoint: {name!r} is already a {other.kind} endpoint")
    return name


def served_endpoint_save(*, name: str, base_url: str, model: str) -> Endpoint:
    """The chat endpoint `name` at `base_url`, no key, allowing the job's model alone."""
    endpoint, _ = endpoint_save(name=name, kind=Endpoint.Kind.CHAT, base_url=base_url)
    endpoint.allowed_models = [model]
    endpoint.full_clean()
    endpoint.save(update_fields=["allowed_models", "updated_at"])
    return endpoint


@dataclass(frozen=True)
class Served:
    endpoint: Endpoint
    process: subprocess.Popen
    log: Path


@contextlib.contextmanager
def job_served(
    job_id: int, options: ServeOptions, *, say: Callable[[str], object] = print
) -> Iterator[Served]:
    """The job's model served and named as an endpoint while the block runs; the engine
    stopped (its whole session) however the block ends."""
    job = served_job(job_id)
    endpoint_name = endpoint_name_for(job, options.endpoint)
    engine = engine_choose(options.engine, options.device)
    model_dir = model_store.model_fetch(job.id)
    name = job.fine_tuned_model
    with tempfile.TemporaryDirectory(prefix="serve-model-") as tmp:
        workdir = Path(tmp)
        log = workdir / "engine.log"
        launch = engine_launch(engine, model_dir, name, options, workdir)
        process = engine_start(launch, log)
        try:
            base_url = base_url_of(options.host, options.port)
            engine_wait_ready(process, base_url, name, log, READY_SECONDS)
            endpoint = served_endpoint_save(name=endpoint_name, base_url=base_url, model=name)
            say(f"Serving {name} with {engine}: endpoint {endpoint_described(endpoint)}")
            yield Served(endpoint, process, log)
        finally:
            engine_stop(process)


def serve(job_id: int, options: ServeOptions, *, say: Callable[[str], object] = print) -> None:
    """`job_served` until SIGTERM or Ctrl-C; ServingError if the engine stops by itself."""

    def interrupt(signum, frame) -> None:
        raise KeyboardInterrupt

    # Installed first: a SIGTERM while the model loads stops the engine as well.
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        with job_served(job_id, options, say=say) as served:
            while served.process.poll() is None:
                time.sleep(0.5)
            raise ServingError(
                f"engine: it exited with status {served.process.returncode}\n"
                + _log_tail(served.log)
            )
    except KeyboardInterrupt:
        say("Stopped.")
    finally:
        signal.signal(signal.SIGTERM, previous)
