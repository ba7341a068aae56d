"""Local fine-tuning providers for tests: synth-ai's learning API and OpenAI's fine-tuning API.

Each is a real HTTP server on loopback that records every request (with its Authorization
header and Idempotency-Key) and plays a scripted job: every status read advances the job one
tick, each tick adding events, metric points and maybe a final status. Uploads parse the
multipart body and keep the file's bytes, so tests can hash exactly what arrived.
"""

from __future__ import annotations

import email.parser
import email.policy
import hashlib
import itertools
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Tick:
    """What one status read reveals: a status, events (type, message, data) and metrics."""

    status: str
    events: list[tuple[str, str, dict]] = field(default_factory=list)
    metrics: list[tuple[str, int, float]] = field(default_factory=list)
    fine_tuned_model: str = ""
    error: str = ""
    trained_tokens: int | None = None


def succeeding_script(model: str = "ft:gpt-4o-mini:studio:crafter:abc123") -> list[Tick]:
    return [
        Tick("running", [("sft.started", "Training started", {})], [("train.loss", 1, 2.5)]),
        Tick(
            "running",
            [("sft.progress", "Step 2/3", {"step": 2})],
            [("train.loss", 2, 1.75), ("val.loss", 2, 1.9)],
        ),
        Tick(
            "succeeded",
            [("sft.completed", "Training finished", {"fine_tuned_model": model})],
            [("train.loss", 3, 1.25), ("val.loss", 3, 1.5)],
            fine_tuned_model=model,
            trained_tokens=4242,
        ),
    ]


def failing_script(error: str = "CUDA out of memory at step 2 <script>x</script>") -> list[Tick]:
    return [
        Tick("running", [("sft.started", "Training started", {})], [("train.loss", 1, 2.5)]),
        Tick("failed", [("sft.failed", error, {})], [], error=error),
    ]


@dataclass
class Upload:
    filename: str
    content: bytes
    purpose: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    def rows(self) -> list[dict]:
        return [json.loads(line) for line in self.content.decode().splitlines() if line]


@dataclass
class RemoteJob:
    id: str
    body: dict
    script: list[Tick]
    status: str = "queued"
    started: int = 0
    ticks: int = 0
    events: list[dict] = field(default_factory=list)
    points: list[dict] = field(default_factory=list)
    fine_tuned_model: str = ""
    error: str = ""
    trained_tokens: int | None = None
    created_at: int = field(default_factory=lambda: int(time.time()))


class _Base:
    """Shared machinery: the server thread, the request log, uploads and jobs."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.uploads: dict[str, Upload] = {}
        self.jobs: dict[str, RemoteJob] = {}
        self.idempotent: dict[str, str] = {}
        self.script: list[Tick] = succeeding_script()
        self.upload_failures = 0  # answer this many uploads with 500 first
        self.create_failures = 0
        # Off: repeats are not recognised by key, so only the studio's own bookkeeping helps.
        self.honour_idempotency = True
        self.hold_start = threading.Event()
        self.hold_start.set()  # cleared by a test to keep a start request waiting
        self.start_waiting = threading.Event()
        self.lock = threading.Lock()
        # A test's own answer: called with (handler, method, path) before the route; True
        # when it answered (a redirect, a trickle, raw bytes), False to route as usual.
        self.override: Any = None
        self._ids = itertools.count(1)
        self._seq = itertools.count(1)
        self.httpd: ThreadingHTTPServer | None = None

    def start(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return None

            def _body(self) -> bytes:
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _send(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                body = self._body() if method == "POST" else b""
                parsed = urllib.parse.urlsplit(self.path)
                record = {
                    "method": method,
                    "path": parsed.path,
                    "query": urllib.parse.parse_qs(parsed.query),
                    "authorization": self.headers.get("Authorization", ""),
                    "idempotency_key": self.headers.get("Idempotency-Key", ""),
                    "bytes": len(body),
                }
                with server.lock:
                    server.requests.append(record)
                if server.override is not None and server.override(self, method, parsed.path):
                    return
                status, payload = server.route(method, parsed, self.headers, body)
                self._send(status, payload)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.hold_start.set()
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()

    @property
    def port(self) -> int:
        assert self.httpd is not None
        return self.httpd.server_address[1]

    def calls(self, method: str, suffix: str) -> list[dict]:
        return [r for r in self.requests if r["method"] == method and r["path"].endswith(suffix)]

    # -- pieces ------------------------------------------------------------------------

    def _upload(self, headers, body: bytes) -> tuple[int, Any]:
        key = headers.get("Idempotency-Key", "")
        with self.lock:
            if self.upload_failures > 0:
                self.upload_failures -= 1
                return 500, {"error": {"message": "scripted upload failure"}}
            if self.honour_idempotency and key in self.idempotent:
                return 200, self._file_json(self.idempotent[key])
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            b"Content-Type: " + headers["Content-Type"].encode() + b"\r\n\r\n" + body
        )
        fields: dict[str, Any] = {}
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            fields[name] = (part.get_filename(), part.get_payload(decode=True))
        filename, content = fields["file"]
        purpose = fields.get("purpose", (None, b""))[1].decode()
        with self.lock:
            file_id = f"file-{next(self._ids)}"
            self.uploads[file_id] = Upload(filename, content, purpose)
            if key:
                self.idempotent[key] = file_id
        return 200, self._file_json(file_id)

    def _file_json(self, file_id: str) -> dict:
        upload = self.uploads[file_id]
        return {
            "id": file_id,
            "object": "file",
            "bytes": len(upload.content),
            "created_at": int(time.time()),
            "filename": upload.filename,
            "purpose": upload.purpose,
            "status": "processed",
        }

    def _create(self, headers, body: dict, prefix: str) -> RemoteJob | tuple[int, Any]:
        key = headers.get("Idempotency-Key", "")
        with self.lock:
            if self.create_failures > 0:
                self.create_failures -= 1
                return 503, {"error": {"message": "scripted create failure"}}
            if self.honour_idempotency and key in self.idempotent:
                return self.jobs[self.idempotent[key]]
            job = RemoteJob(id=f"{prefix}-{next(self._ids)}", body=body, script=list(self.script))
            self.jobs[job.id] = job
            if key:
                self.idempotent[key] = job.id
            return job

    def _advance(self, job: RemoteJob) -> None:
        with self.lock:
            if job.status in ("succeeded", "failed", "cancelled", "canceled") or not job.started:
                return
            if job.ticks >= len(job.script):
                return
            tick = job.script[job.ticks]
            job.ticks += 1
            job.status = tick.status
            for kind, message, data in tick.events:
                job.events.append(
                    {"seq": next(self._seq), "type": kind, "message": message, "data": data}
                )
            for name, step, value in tick.metrics:
                job.points.append(
                    {"name": name, "step": step, "value": value, "seq": next(self._seq)}
                )
            job.fine_tuned_model = tick.fine_tuned_model or job.fine_tuned_model
            job.error = tick.error or job.error
            job.trained_tokens = tick.trained_tokens or job.trained_tokens


class SynthServer(_Base):
    """synth-ai's learning API under `/api` (docs/training.md)."""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def route(self, method: str, url, headers, body: bytes) -> tuple[int, Any]:
        path = url.path.removeprefix("/api")
        query = urllib.parse.parse_qs(url.query)
        parts = [p for p in path.split("/") if p]
        if method == "POST" and path == "/learning/files":
            return self._upload(headers, body)
        if method == "POST" and path == "/learning/jobs":
            created = self._create(headers, json.loads(body), "sft")
            if isinstance(created, tuple):
                return created
            return 200, {"job_id": created.id, "status": created.status}
        if len(parts) >= 3 and parts[:2] == ["learning", "jobs"]:
            job = self.jobs.get(parts[2])
            if job is None:
                return 404, {"detail": "no such job"}
            tail = parts[3] if len(parts) > 3 else ""
            if method == "POST" and tail == "start":
                self.start_waiting.set()
                self.hold_start.wait(60)
                with self.lock:
                    job.started += 1
                return 200, {"id": job.id, "status": "queued"}
            if method == "POST" and tail == "cancel":
                with self.lock:
                    job.status = "cancelled"
                    job.events.append(
                        {"seq": next(self._seq), "type": "sft.cancelled", "message": "Cancelled"}
                    )
                return 200, {"id": job.id, "status": "cancelled"}
            if method == "GET" and tail == "":
                self._advance(job)
                return 200, {
                    "id": job.id,
                    "status": job.status,
                    "fine_tuned_model": job.fine_tuned_model or None,
                    "error": job.error or None,
                    "trained_tokens": job.trained_tokens,
                }
            if method == "GET" and tail == "events":
                since = int(query.get("since_seq", ["0"])[0])
                return 200, {"events": [e for e in job.events if e["seq"] > since]}
            if method == "GET" and tail == "metrics":
                after = int(query.get("after_step", ["-1"])[0])
                points = [
                    {k: p[k] for k in ("name", "step", "value")}
                    for p in job.points
                    if p["step"] > after
                ]
                return 200, {"points": points}
        return 404, {"detail": f"no route {method} {path}"}


class OpenAIFineTuningServer(_Base):
    """OpenAI's `/v1/files` and `/v1/fine_tuning/jobs` as the `openai` package calls them."""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _job_json(self, job: RemoteJob) -> dict:
        body = job.body
        return {
            "id": job.id,
            "object": "fine_tuning.job",
            "created_at": job.created_at,
            "model": body.get("model"),
            "organization_id": "org-test",
            "status": job.status,
            "training_file": body.get("training_file"),
            "validation_file": body.get("validation_file"),
            "hyperparameters": (body.get("method") or {})
            .get("supervised", {})
            .get("hyperparameters", {}),
            "method": body.get("method"),
            "metadata": body.get("metadata"),
            "seed": body.get("seed", 0),
            "fine_tuned_model": job.fine_tuned_model or None,
            "trained_tokens": job.trained_tokens,
            "finished_at": None,
            "result_files": [],
            "error": {"code": "invalid_training_file", "message": job.error, "param": None}
            if job.error
            else None,
        }

    def route(self, method: str, url, headers, body: bytes) -> tuple[int, Any]:
        path = url.path.removeprefix("/v1")
        query = urllib.parse.parse_qs(url.query)
        parts = [p for p in path.split("/") if p]
        if method == "POST" and path == "/files":
            return self._upload(headers, body)
        if path == "/fine_tuning/jobs" and method == "POST":
            created = self._create(headers, json.loads(body), "ftjob")
            if isinstance(created, tuple):
                return created
            with self.lock:
                created.started = 1  # OpenAI starts a job when it is created
                created.status = "validating_files"
            return 200, self._job_json(created)
        if path == "/fine_tuning/jobs" and method == "GET":
            wanted = {
                k[len("metadata[") : -1]: v[0]
                for k, v in query.items()
                if k.startswith("metadata[")
            }
            found = [
                self._job_json(j)
                for j in self.jobs.values()
                if all((j.body.get("metadata") or {}).get(k) == v for k, v in wanted.items())
            ]
            return 200, {"object": "list", "data": found, "has_more": False}
        if len(parts) >= 3 and parts[:2] == ["fine_tuning", "jobs"]:
            job = self.jobs.get(parts[2])
            if job is None:
                return 404, {"error": {"message": "no such job"}}
            tail = parts[3] if len(parts) > 3 else ""
            if method == "GET" and tail == "":
                self._advance(job)
                return 200, self._job_json(job)
            if method == "POST" and tail == "cancel":
                with self.lock:
                    job.status = "cancelled"
                    job.events.append(
                        {"seq": next(self._seq), "type": "message", "message": "Job cancelled"}
                    )
                return 200, self._job_json(job)
            if method == "GET" and tail == "events":
                # Newest first; `after` pages towards older events, `limit` per page.
                listed = [self._event_json(job, e) for e in reversed(self._all_events(job))]
                after = query.get("after", [""])[0]
                if after:
                    ids = [e["id"] for e in listed]
                    listed = listed[ids.index(after) + 1 :] if after in ids else []
                limit = int(query.get("limit", ["20"])[0])
                return 200, {
                    "object": "list",
                    "data": listed[:limit],
                    "has_more": len(listed) > limit,
                }
        return 404, {"error": {"message": f"no route {method} {path}"}}

    def _all_events(self, job: RemoteJob) -> list[dict]:
        """OpenAI reports metrics as events of type "metrics"; merge both by arrival."""
        merged = [
            {**e, "level": "error" if e["type"].endswith("failed") else "info"} for e in job.events
        ]
        for point in job.points:
            key = "valid_loss" if point["name"].startswith("val") else "train_loss"
            merged.append(
                {
                    "seq": point["seq"],
                    "type": "metrics",
                    "message": f"Step {point['step']}",
                    "data": {"step": point["step"], key: point["value"]},
                    "level": "info",
                }
            )
        return sorted(merged, key=lambda e: e["seq"])

    def _event_json(self, job: RemoteJob, event: dict) -> dict:
        return {
            "id": f"ftevent-{job.id}-{event['seq']}",
            "object": "fine_tuning.job.event",
            "created_at": job.created_at,
            "level": event["level"],
            "message": event["message"],
            "type": "metrics" if event["type"] == "metrics" else "message",
            "data": event.get("data") or {},
        }
