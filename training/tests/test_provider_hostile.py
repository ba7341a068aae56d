"""Providers that redirect, trickle, flood or answer nonsense, through the real poll and submit.

Each test does the bad thing over real HTTP against the local provider servers of
`servers.py` (whose `override` answers a request its own way) and checks what the studio
sent, stored and said.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from django.db import connection, transaction

from studio.models import Endpoint
from studio.testing import wait_for_row, wait_until
from training import services
from training.models import TrainingEvent, TrainingJob
from training.submission import submission_build
from training.tests.conftest import OPENAI_KEY, SYNTH_KEY
from training.tests.servers import Tick

pytestmark = pytest.mark.django_db(transaction=True)


class Listener:
    """A TCP server that only counts the bytes it receives (where a redirect points)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.received = 0
        self._stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/collect"

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            conn.settimeout(0.5)
            try:
                while data := conn.recv(65536):
                    self.received += len(data)
            except OSError:
                pass
            conn.close()

    def close(self) -> None:
        self._stop = True
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    listening = Listener()
    yield listening
    listening.close()


def redirect_to(url: str, *, status: int = 302, methods=("GET", "POST"), path_part: str = ""):
    def answer(handler, method: str, path: str) -> bool:
        if method not in methods or path_part not in path:
            return False
        handler.send_response(status)
        handler.send_header("Location", url)
        handler.send_header("Content-Length", "0")
        handler.end_headers()
        return True

    return answer


def raw_json(text: str, *, path_part: str, method: str = "GET"):
    """Answer matching requests with `text` as the JSON body, whatever it holds."""

    def answer(handler, got_method: str, path: str) -> bool:
        if got_method != method or path_part not in path:
            return False
        data = text.encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
        return True

    return answer


def make_job(server, version, *, provider: str, endpoint: str = "") -> TrainingJob:
    submission = submission_build(
        config_text=_config(),
        provider=provider,
        version_id=version.id,
        base_url="" if endpoint else server.base_url,
        endpoint_name=endpoint,
    )
    return services.training_job_create(submission=submission, enqueue=False)


def _config() -> str:
    from training.tests.conftest import REFERENCE

    return REFERENCE.read_text(encoding="utf-8")


def submitted(server, version, *, provider: str = "synth", endpoint: str = "") -> TrainingJob:
    job = make_job(server, version, provider=provider, endpoint=endpoint)
    assert services.training_job_submit(job_id=job.id) == "submitted"
    job.refresh_from_db()
    return job


def poll(job: TrainingJob) -> str:
    outcome = services.training_job_poll(job_id=job.id)
    job.refresh_from_db()
    return outcome


# -- 1. a key never leaves its endpoint's URL ---------------------------------------------


@pytest.mark.parametrize("path_part", ["/learning/files", "/learning/jobs"])
def test_it_refuses_a_redirect_on_submission_and_sends_the_listener_nothing(
    synth_server, train_version, listener, path_part
):
    synth_server.override = redirect_to(listener.url, status=307, path_part=path_part)
    job = make_job(synth_server, train_version, provider="synth")
    assert services.training_job_submit(job_id=job.id) == "failed"
    job.refresh_from_db()
    assert "redirect" in job.error and "not followed" in job.error
    assert len(job.error.splitlines()) == 1
    time.sleep(0.3)
    assert listener.received == 0


@pytest.mark.parametrize("path_part", ["/events", "/metrics", "/learning/jobs/sft"])
def test_it_refuses_a_redirect_on_every_poll_call_and_the_key_stays(
    synth_server, train_version, listener, settings, path_part
):
    settings.STUDIO_TRAINING_POLL_FAILURES = 2
    job = submitted(synth_server, train_version)
    synth_server.override = redirect_to(listener.url, methods=("GET",), path_part=path_part)
    assert poll(job) == "retry"
    assert poll(job) == "failed"
    assert job.status == "failed"
    assert "redirect" in job.error and "Polling failed 2 times in a row" in job.error
    assert len(job.error.splitlines()) == 1
    time.sleep(0.3)
    assert listener.received == 0


def test_it_refuses_a_redirect_on_cancel(synth_server, train_version, listener):
    job = submitted(synth_server, train_version)
    synth_server.override = redirect_to(listener.url, methods=("POST",), path_part="/cancel")
    assert services.training_job_cancel_remote(job_id=job.id) == "failed"
    assert job.events.filter(type="studio.cancel_failed", message__contains="redirect").exists()
    time.sleep(0.3)
    assert listener.received == 0


def test_it_does_not_send_the_training_file_on_to_an_openai_redirect(
    openai_server, train_version, listener
):
    # 307 keeps the method and body: httpx would re-send the whole file to the new host.
    openai_server.override = redirect_to(listener.url, status=307, path_part="/files")
    job = make_job(openai_server, train_version, provider="openai")
    assert services.training_job_submit(job_id=job.id) == "failed"
    job.refresh_from_db()
    assert "307" in job.error and "not followed" in job.error
    time.sleep(0.3)
    assert listener.received == 0


def test_it_sends_nothing_with_a_disabled_endpoints_key(synth_server, train_version):
    Endpoint.objects.create(
        name="synth-prod", kind="synth", base_url=synth_server.base_url, api_key_env="SYNTH_API_KEY"
    )
    job = submitted(synth_server, train_version, endpoint="synth-prod")
    assert {r["authorization"] for r in synth_server.requests} == {f"Bearer {SYNTH_KEY}"}
    Endpoint.objects.filter(name="synth-prod").update(enabled=False)
    before = len(synth_server.requests)
    assert poll(job) == "failed"
    assert len(synth_server.requests) == before  # not even a request without the key
    assert job.status == "failed"
    assert "disabled" in job.error
    assert services.training_job_cancel_remote(job_id=job.id) == "skipped"
    assert len(synth_server.requests) == before


class DisableDuring:
    """An admin disabling endpoint `name` (committed, from the provider's own thread) while
    the provider receives the first `method` request to a path with `path_part`; that
    request is then answered as usual. `after(key)`: requests carrying `key` that arrived
    once the disable had committed."""

    def __init__(self, server, name: str, *, method: str, path_part: str) -> None:
        self.server, self.name, self.method, self.path_part = server, name, method, path_part
        self.seen: int | None = None
        server.override = self.answer

    def answer(self, handler, method: str, path: str) -> bool:
        if self.seen is None and method == self.method and self.path_part in path:
            try:
                Endpoint.objects.filter(name=self.name).update(enabled=False)
            finally:
                connection.close()
            self.seen = len(self.server.requests)  # this request included
        return False

    def after(self, key: str) -> list[dict]:
        assert self.seen is not None, "the endpoint was never disabled"
        return [
            r for r in self.server.requests[self.seen :] if r["authorization"] == f"Bearer {key}"
        ]


def test_it_sends_the_key_at_most_once_after_a_disable_in_the_middle_of_a_poll(
    synth_server, train_version
):
    Endpoint.objects.create(
        name="synth-prod", kind="synth", base_url=synth_server.base_url, api_key_env="SYNTH_API_KEY"
    )
    job = submitted(synth_server, train_version, endpoint="synth-prod")
    admin = DisableDuring(synth_server, "synth-prod", method="GET", path_part="/learning/jobs/")

    assert poll(job) == "failed"

    assert len(admin.after(SYNTH_KEY)) <= 1
    assert job.status == "failed"
    assert job.error.startswith("endpoint 'synth-prod' was disabled by an admin")
    assert len(job.error.splitlines()) == 1


@pytest.mark.parametrize("provider", ["synth", "openai"])
def test_it_sends_the_key_at_most_once_after_a_disable_in_the_middle_of_a_submission(
    synth_server, openai_server, train_version, provider
):
    server, key, variable = {
        "synth": (synth_server, SYNTH_KEY, "SYNTH_API_KEY"),
        "openai": (openai_server, OPENAI_KEY, "OPENAI_API_KEY"),
    }[provider]
    Endpoint.objects.create(
        name="prod", kind=provider, base_url=server.base_url, api_key_env=variable
    )
    job = make_job(server, train_version, provider=provider, endpoint="prod")
    admin = DisableDuring(server, "prod", method="POST", path_part="/files")

    assert services.training_job_submit(job_id=job.id) == "failed"

    assert len(admin.after(key)) <= 1
    job.refresh_from_db()
    assert job.status == "failed"
    assert job.error.startswith("endpoint 'prod' was disabled by an admin")
    assert not job.remote_job_id


# -- 2. slow, huge or hostile -------------------------------------------------------------


def trickle(path_part: str, *, every: float):
    """Headers at once, then one byte of the body every `every` seconds (slow-loris)."""

    def answer(handler, method: str, path: str) -> bool:
        if method != "GET" or path_part not in path:
            return False
        body = b'{"status": "running", "padding": "' + b"x" * 200 + b'"}'
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        try:
            for byte in body:
                handler.wfile.write(bytes([byte]))
                handler.wfile.flush()
                time.sleep(every)
        except OSError:
            pass
        return True

    return answer


def test_a_trickling_provider_is_cut_at_the_call_deadline_and_asked_by_one_worker(
    synth_server, train_version, settings
):
    settings.STUDIO_TRAINING_CALL_SECONDS = 1.5
    settings.STUDIO_TRAINING_POLL_SECONDS = 0.2
    job = submitted(synth_server, train_version)
    second = submitted(synth_server, train_version)
    synth_server.override = trickle(f"/learning/jobs/{job.remote_job_id}", every=0.3)
    TrainingJob.objects.update(polled_at=None)
    results: list[int] = []
    first = threading.Thread(target=lambda: results.append(services.training_jobs_poll_active()))
    started = time.monotonic()
    first.start()
    time.sleep(0.5)
    # A second beat tick meanwhile: the polls' lease is held, so it takes no worker time
    # and never asks the trickling provider a second time.
    assert services.training_jobs_poll_active() == 0
    first.join(timeout=30)
    took = time.monotonic() - started
    assert results == [2]
    # One status read of the trickling job, cut at its deadline (1.5 s, not 200 x 0.3 s).
    status_reads = synth_server.calls("GET", f"/learning/jobs/{job.remote_job_id}")
    assert len(status_reads) == 1
    assert took < 10
    job.refresh_from_db()
    second.refresh_from_db()
    assert job.status == "submitted" and job.error == ""  # waited for, not failed
    assert second.polled_at is not None


def test_a_flood_of_events_and_points_is_stored_a_polls_worth_at_a_time_none_lost(
    synth_server, train_version
):
    synth_server.script = [
        Tick(
            "running",
            [("sft.progress", f"event {i}", {}) for i in range(1200)],
            [(name, step, step / 10) for step in range(1, 2501) for name in ("loss", "val.loss")],
        )
    ]
    job = submitted(synth_server, train_version)
    counts = []
    for _ in range(4):
        poll(job)
        counts.append(
            (
                job.events.filter(type="sft.progress").count(),
                job.events.filter(type="metric").count(),
            )
        )
    # 500 events and under 2,000 points a poll, whole steps only (999 of 2 points: the
    # 1,000th step would reach the cap), then the rest.
    assert counts == [(500, 1998), (1000, 3996), (1200, 5000), (1200, 5000)]
    messages = list(
        job.events.filter(type="sft.progress").order_by("remote_id").values_list("message")
    )
    assert len(set(messages)) == 1200
    # Every step has both of its points: none was cut between two polls.
    assert job.events.filter(type="metric", validation_loss__isnull=False).count() == 2500


def test_an_openai_backlog_is_read_over_several_polls_with_nothing_lost(
    openai_server, train_version
):
    openai_server.script = [
        Tick("running", [("message", f"event {i}", {}) for i in range(1234)]),
        Tick("running", [("message", f"late {i}", {}) for i in range(7)]),
        Tick("running", []),
        Tick("running", []),
    ]
    job = submitted(openai_server, train_version, provider="openai")
    for _ in range(4):
        poll(job)
        assert job.status == "running", job.error
    stored = list(job.events.exclude(type__startswith="studio.").values_list("message", flat=True))
    expected = {f"event {i}" for i in range(1234)} | {f"late {i}" for i in range(7)}
    assert set(stored) >= expected
    assert len(stored) == len(set(stored))  # each once


@pytest.mark.parametrize(
    "answer",
    [
        '{"events": [{"seq": 1e400, "type": "sft.progress"}]}',
        '{"events": [{"seq": NaN, "type": "sft.progress"}, {"seq": -Infinity}]}',
        '{"events": [{"seq": 5, "type": "x", "created_at": 1e300, "data": {"step": 1e400}}]}',
    ],
)
def test_values_out_of_range_are_dropped_not_a_wedged_job(synth_server, train_version, answer):
    job = submitted(synth_server, train_version)
    synth_server.override = raw_json(answer, path_part="/events")
    assert poll(job) == "running"
    assert job.status == "running" and job.poll_failures == 0


def test_a_provider_answering_nonsense_fails_the_job_after_n_polls_with_one_line(
    synth_server, train_version, settings
):
    settings.STUDIO_TRAINING_POLL_FAILURES = 3
    job = submitted(synth_server, train_version)
    deep = "[" * 100_000 + "]" * 100_000
    synth_server.override = raw_json(deep, path_part=f"/learning/jobs/{job.remote_job_id}")
    assert [poll(job) for _ in range(3)] == ["retry", "retry", "failed"]
    assert job.status == "failed"
    assert "unreadable JSON" in job.error and len(job.error.splitlines()) == 1
    # Cancel of the same hostile provider answers in one line too, never a traceback.
    assert services.training_job_cancel_remote(job_id=job.id) == "skipped"


def test_an_openai_job_id_that_climbs_out_of_its_url_is_refused(openai_server, train_version):
    def dotdot(handler, method: str, path: str) -> bool:
        if method != "POST" or not path.endswith("/fine_tuning/jobs"):
            return False
        data = json.dumps({"id": "..", "object": "fine_tuning.job", "status": "queued"}).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
        return True

    openai_server.override = dotdot
    job = make_job(openai_server, train_version, provider="openai")
    assert services.training_job_submit(job_id=job.id) == "failed"
    job.refresh_from_db()
    assert job.status == "failed" and job.remote_job_id == ""
    assert "unusable id" in job.error


def test_an_answer_over_the_size_cap_is_refused(synth_server, train_version, monkeypatch):
    monkeypatch.setattr("training.providers.http.MAX_ANSWER_BYTES", 10_000)
    monkeypatch.setattr("training.providers.synth.provider_http_client", _small_client)
    job = submitted(synth_server, train_version)
    synth_server.override = raw_json(
        json.dumps({"events": [{"seq": 1, "message": "x" * 20_000}]}), path_part="/events"
    )
    assert poll(job) == "retry"
    assert job.poll_failures == 1


def _small_client(**options):
    from training.providers.http import provider_http_client

    return provider_http_client(**options)


def test_a_job_succeeded_without_a_model_keeps_asking_then_says_so(
    synth_server, train_version, settings
):
    settings.STUDIO_TRAINING_MODEL_WAIT_SECONDS = 3600
    # The completion event comes before the status names the model (synth-ai's own poller
    # reads the status again for this reason).
    synth_server.script = [
        Tick("running", [("sft.completed", "Training finished", {})]),
        Tick("running", []),
        Tick("succeeded", [], fine_tuned_model="ft:late-model"),
    ]
    job = submitted(synth_server, train_version)
    assert poll(job) == "running"
    assert job.status == "running" and job.success_reported_at is not None
    assert poll(job) == "running"
    assert poll(job) == "succeeded"
    assert job.fine_tuned_model == "ft:late-model"
    assert job.remote_status == "succeeded"


def test_past_the_wait_a_job_without_a_model_fails_and_refresh_finds_it(
    synth_server, train_version, settings
):
    settings.STUDIO_TRAINING_MODEL_WAIT_SECONDS = 0
    synth_server.script = [Tick("succeeded", [("sft.completed", "done", {})])]
    job = submitted(synth_server, train_version)
    assert poll(job) == "failed"
    assert "reported success but gave no model id" in job.error
    assert job.needs_model_refresh
    assert services.training_job_refresh(job_id=job.id) == "no_model"
    synth_server.jobs[job.remote_job_id].fine_tuned_model = "ft:found-later"
    assert services.training_job_refresh(job_id=job.id) == "succeeded"
    job.refresh_from_db()
    assert (job.status, job.fine_tuned_model, job.error) == ("succeeded", "ft:found-later", "")


def test_the_model_id_in_the_completion_event_is_enough(synth_server, train_version):
    synth_server.script = [
        Tick("running", [("sft.completed", "done", {"fine_tuned_model": "ft:from-event"})])
    ]
    job = submitted(synth_server, train_version)
    assert poll(job) == "succeeded"
    assert job.fine_tuned_model == "ft:from-event"


def test_escapes_from_a_provider_never_reach_the_terminal(
    celery_worker, synth_server, train_version
):
    from curation.tests.conftest import run
    from training.tests.conftest import REFERENCE

    hostile = "clear\x1b[2Jtitle\x1b]0;pwned\x07end\x9b"
    synth_server.script = [
        Tick("running", [("sft.progress", hostile, {})]),
        Tick("failed", [("sft.failed", "boom\x1b[31m", {})], error="boom\x1b[31m"),
    ]
    outcome = run(
        "submit_training",
        "--config",
        str(REFERENCE),
        "--dataset-version",
        str(train_version.id),
        "--base-url",
        synth_server.base_url,
        "--wait",
    )
    assert outcome.code == 1
    assert "clear\\x1b[2Jtitle\\x1b]0;pwned\\x07end\\x9b" in outcome.stderr
    assert "submit_training: error: training job" in outcome.stderr
    assert "failed: boom\\x1b[31m" in outcome.stderr
    for control in ("\x1b", "\x07", "\x9b"):
        assert control not in outcome.stderr + outcome.stdout
    # Stored as the provider sent it (escaped when shown): the page escapes HTML itself.
    assert TrainingEvent.objects.filter(message=hostile).exists()


def test_the_refresh_button_finds_a_late_model(synth_server, train_version, settings, submitter):
    from django.test import Client

    settings.STUDIO_TRAINING_MODEL_WAIT_SECONDS = 0
    synth_server.script = [Tick("succeeded", [("sft.completed", "done", {})])]
    job = submitted(synth_server, train_version)
    poll(job)
    client = Client()
    client.force_login(submitter)
    page = client.get(f"/training/{job.id}/").content.decode()
    assert "reported success but gave no model id" in page and 'id="refresh-job"' in page
    synth_server.jobs[job.remote_job_id].fine_tuned_model = "ft:via-button"
    response = client.post(f"/training/{job.id}/refresh/", follow=True)
    assert response.status_code == 200
    job.refresh_from_db()
    assert (job.status, job.fine_tuned_model) == ("succeeded", "ft:via-button")
    assert 'id="refresh-job"' not in response.content.decode()


def test_a_cancel_the_broker_lost_is_sent_again_by_the_beat_task(
    broker_switch, synth_server, train_version
):
    from training.models import TrainingJob as Job

    job = submitted(synth_server, train_version)
    broker_switch.down()
    with transaction.atomic():
        services.training_job_cancel(job=Job.objects.get(id=job.id))
    broker_switch.up()
    assert synth_server.calls("POST", "/cancel") == []
    # The row says no cancel is on its way (the broker refused it): the next tick sends it,
    # and the one after does not send it twice.
    assert services.training_cancels_resend() == 1
    assert services.training_cancels_resend() == 0
    wait_until(lambda: synth_server.calls("POST", "/cancel"), timeout=30, what="the cancel")
    job = wait_for_row(job, statuses=("canceled",), timeout=30)
    assert services.training_cancels_resend() == 0


@pytest.mark.parametrize("provider", ["synth", "openai"])
def test_a_status_that_is_no_status_counts_as_a_failed_poll(
    request, train_version, settings, provider
):
    settings.STUDIO_TRAINING_POLL_FAILURES = 2
    server = request.getfixturevalue(f"{provider}_server")
    server.script = [Tick({"x": 1})]
    job = submitted(server, train_version, provider=provider)
    assert poll(job) == "retry"
    assert (job.status, job.poll_failures) == ("submitted", 1)
    assert poll(job) == "failed"
    assert "unusable status: {'x': 1}" in job.error
    assert len(job.error.splitlines()) == 1


HOSTILE_MODEL = "ft:model\x1b]0;PWNED\x07"
COMPLETED_NAMING_IT = ("sft.completed", "done", {"fine_tuned_model": HOSTILE_MODEL})


@pytest.mark.parametrize(
    ("provider", "tick"),
    [
        ("synth", Tick("succeeded", [], fine_tuned_model=HOSTILE_MODEL)),
        ("synth", Tick("running", [COMPLETED_NAMING_IT])),
        ("openai", Tick("succeeded", [], fine_tuned_model=HOSTILE_MODEL)),
    ],
    ids=["synth-status", "synth-event", "openai-status"],
)
def test_a_model_id_with_control_characters_is_refused(
    request, train_version, settings, provider, tick
):
    settings.STUDIO_TRAINING_POLL_FAILURES = 2
    server = request.getfixturevalue(f"{provider}_server")
    server.script = [tick]
    job = submitted(server, train_version, provider=provider)
    assert poll(job) == "retry"
    assert (job.status, job.fine_tuned_model, job.poll_failures) == ("submitted", "", 1)
    assert poll(job) == "failed"
    assert job.fine_tuned_model == ""
    assert "unusable model id: 'ft:model\\x1b]0;PWNED\\x07'" in job.error
    assert "\x1b" not in job.error and "\x07" not in job.error


def test_an_upload_whose_answer_dribbles_is_cut_at_a_deadline_of_its_size(
    synth_server, train_version, settings
):
    settings.STUDIO_TRAINING_CALL_SECONDS = 1
    settings.STUDIO_TRAINING_MAX_RETRIES = 0

    def dribble(handler, method: str, path: str) -> bool:
        if method != "POST" or not path.endswith("/learning/files"):
            return False
        body = json.dumps({"id": "file-dribbled"}).encode()
        head = (
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            f"X-Padding: {'x' * 60}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        try:
            for byte in head:  # about 30 s before the answer's body can begin
                handler.wfile.write(bytes([byte]))
                handler.wfile.flush()
                time.sleep(0.25)
            handler.wfile.write(body)
        except OSError:
            pass
        return True

    synth_server.override = dribble
    job = make_job(synth_server, train_version, provider="synth")
    started = time.monotonic()
    assert services.training_job_submit(job_id=job.id) == "retry"
    took = time.monotonic() - started
    uploaded = synth_server.calls("POST", "/learning/files")[0]["bytes"]
    # 1 s (the call's deadline) and the file at 128 KiB/s, not STUDIO_TRAINING_UPLOAD_SECONDS.
    assert uploaded < 400_000
    assert took < 1 + uploaded / (128 * 1024) + 3
    job.refresh_from_db()
    assert job.remote_training_file_id == "" and "took longer than" in job.error
