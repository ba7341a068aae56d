"""The upload page: the file is saved, a worker checks and imports it, the page follows."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from django.contrib.messages.storage.fallback import FallbackStorage
from django.contrib.sessions.backends.db import SessionStore
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import RequestFactory
from django.urls import reverse

from curation import views
from curation.models import Dataset, DatasetImport
from curation.tests.test_import_hostile import HOSTILE_LINES, _counts, good_row, png_url
from rollouts.models import Frame
from studio.testing import JOB_ENDS, wait_for_row

IMPORT_URL = "datasets:dataset_import"


def _upload(name: str, lines: list[str]) -> SimpleUploadedFile:
    return SimpleUploadedFile(name, "".join(line + "\n" for line in lines).encode())


def test_it_imports_an_upload_on_a_worker_and_the_page_follows_it(
    celery_worker, editor_client, settings
):
    lines = [good_row(f"observation {n}", png_url((n, 0, 0))) for n in range(3)]
    response = editor_client.post(
        reverse(IMPORT_URL), {"file": _upload("rows.jsonl", lines), "name": ""}
    )
    assert response.status_code == 302
    job = DatasetImport.objects.get()
    assert response["Location"] == reverse("datasets:import_detail", args=[job.id])
    assert job.enqueued_at is not None
    job = wait_for_row(DatasetImport, job.id, statuses=JOB_ENDS)
    assert job.status == "done", (job.error, job.errors)
    dataset = Dataset.objects.get(name="rows.jsonl")
    assert job.dataset_id == dataset.id and job.summary["turns"] == 3
    assert job.written_lines == job.total_lines == 3 and job.progress_percent == 100
    page = editor_client.get(reverse("datasets:import_detail", args=[job.id]))
    assert b"Imported 3 turns in 3 episodes (3 frames)" in page.content
    # The upload has served its purpose; the frames are what stays.
    assert not (Path(settings.MEDIA_ROOT) / job.upload).exists()
    assert Frame.objects.filter(episode__batch_id=job.summary["batch_id"]).count() == 3


def test_it_lists_every_hostile_line_of_an_upload_and_imports_nothing(
    celery_worker, editor_client, settings
):
    lines = [good_row(url=png_url())] + [line for line, _ in HOSTILE_LINES.values()]
    before = _counts()
    upload = SimpleUploadedFile(
        "hostile.jsonl", "".join(line + "\n" for line in lines).encode("utf-8", "surrogatepass")
    )
    response = editor_client.post(reverse(IMPORT_URL), {"file": upload})
    assert response.status_code == 302
    job = wait_for_row(DatasetImport, DatasetImport.objects.get().id, statuses=JOB_ENDS)
    assert job.status == "failed"
    assert job.error == f"{len(HOSTILE_LINES)} error(s) in the file, nothing imported"
    assert [e.split(":", 1)[0] for e in job.errors] == [
        f"line {n}" for n in range(2, len(lines) + 1)
    ]
    for error, (_, expected) in zip(job.errors, HOSTILE_LINES.values(), strict=True):
        assert expected in error
    assert _counts() == before
    assert not list(Path(settings.MEDIA_ROOT).rglob("*.png"))
    page = editor_client.get(reverse("datasets:import_detail", args=[job.id]))
    assert page.status_code == 200 and b"line 4: " in page.content


def test_it_answers_400_for_an_empty_upload(editor_client):
    empty = SimpleUploadedFile("empty.jsonl", b"")
    response = editor_client.post(reverse(IMPORT_URL), {"file": empty})
    assert response.status_code == 400
    assert b"The submitted file is empty." in response.content
    missing = editor_client.post(reverse(IMPORT_URL), {"name": "no file"})
    assert missing.status_code == 400
    assert not DatasetImport.objects.exists()


def test_it_refuses_an_oversize_upload_by_its_declared_length_without_reading_it(
    editor_client, settings
):
    settings.STUDIO_IMPORT_MAX_BYTES = 100_000
    big = SimpleUploadedFile("big.jsonl", b"x" * 1_000_000)
    response = editor_client.post(reverse(IMPORT_URL), {"file": big})
    assert response.status_code == 400
    assert b"The file is larger than 97.7\xc2\xa0KB (100000 bytes)." in response.content
    assert not DatasetImport.objects.exists()
    assert not (Path(settings.MEDIA_ROOT) / "imports").exists()


def test_it_stops_reading_an_upload_once_it_streams_past_the_limit(editor, settings):
    """Declared length within the allowance for the envelope, file over the limit: the
    upload is cut off mid-stream, the rest of the body is never read."""
    settings.STUDIO_IMPORT_MAX_BYTES = 100_000
    request = RequestFactory().post(
        reverse(IMPORT_URL),
        {"file": SimpleUploadedFile("big.jsonl", b"x" * 160_000), "name": "n"},
    )
    request.user = editor
    request.session = SessionStore()
    request._messages = FallbackStorage(request)
    request._dont_enforce_csrf_checks = True
    body = request.environ["wsgi.input"]
    response = views.dataset_import(request)
    assert response.status_code == 400
    assert b"The file is larger than" in response.content
    # FakePayload counts down as it is read: past the limit and one read-ahead chunk,
    # nothing was read.
    assert len(body) > 20_000
    assert not DatasetImport.objects.exists()


def test_it_says_what_is_wrong_with_an_image_without_object_reprs(editor_client, tmp_path):
    not_an_image = "data:image/png;base64," + base64.b64encode(b"hello, not a png").decode()
    line = good_row(url=not_an_image)
    path = tmp_path / "x.jsonl"
    path.write_text(line + "\n")
    from curation.tests.conftest import run

    result = run("import_jsonl", str(path))
    assert result.code == 1
    first = result.stderr.splitlines()[0]
    assert first.startswith(
        "import_jsonl: error: line 1: message 1 part 2: image cannot be decoded"
    )
    assert "object at" not in first and "0x" not in first, first


@pytest.mark.django_db
def test_it_keeps_texts_of_any_exception_free_of_reprs():
    import io

    from PIL import Image, UnidentifiedImageError

    from studio.errors import plain_error

    with pytest.raises(UnidentifiedImageError) as caught:
        Image.open(io.BytesIO(b"nope"))
    assert "object at 0x" in str(caught.value)  # what Pillow says
    said = plain_error(caught.value)
    assert said == "UnidentifiedImageError: cannot identify image file the data"
    assert json.dumps(plain_error(ValueError())) == '"ValueError"'


def _stored_job(lines: list[str], **fields) -> DatasetImport:
    """An import as the page leaves it (upload saved, row pending), not yet sent."""
    from django.core.files.storage import default_storage

    stored = default_storage.save("imports/t.jsonl", _upload("t.jsonl", lines))
    return DatasetImport.objects.create(
        upload=stored, original_name="t.jsonl", total_bytes=default_storage.size(stored), **fields
    )


@pytest.mark.django_db
def test_it_runs_an_import_once_whatever_the_deliveries(settings):
    from datetime import timedelta

    from django.utils import timezone

    from curation.jobs import IMPORT
    from curation.services_import import dataset_import_run

    job = _stored_job([good_row("one"), good_row("two")])
    # A fresh claim held by another worker: this delivery steps back.
    DatasetImport.objects.filter(id=job.id).update(
        status="running", claim_token="other", heartbeat_at=timezone.now()
    )
    assert dataset_import_run(job_id=job.id) == "busy"
    # That worker died (its heartbeat went silent): the next delivery takes over.
    DatasetImport.objects.filter(id=job.id).update(
        heartbeat_at=timezone.now() - IMPORT.stale_after() - timedelta(seconds=1)
    )
    assert dataset_import_run(job_id=job.id) == "done"
    assert dataset_import_run(job_id=job.id) == "done_already"
    job.refresh_from_db()
    assert job.claim_token != "other" and job.summary["turns"] == 2
    assert job.checked_bytes == job.total_bytes > 0
    assert Dataset.objects.count() == 1


@pytest.mark.django_db
def test_it_removes_the_upload_of_a_failed_import(settings):
    from curation.services_import import dataset_import_run

    job = _stored_job(["{broken"])
    assert (Path(settings.MEDIA_ROOT) / job.upload).exists()
    assert dataset_import_run(job_id=job.id) == "failed"
    job.refresh_from_db()
    assert job.errors == [
        "line 1: not JSON (Expecting property name enclosed in double quotes: line 1 column 2 "
        "(char 1))"
    ]
    assert not (Path(settings.MEDIA_ROOT) / job.upload).exists()


@pytest.mark.django_db
def test_it_shows_progress_while_an_import_runs(editor_client):
    job = _stored_job([good_row()], status="running", phase="writing")
    DatasetImport.objects.filter(id=job.id).update(total_lines=10, written_lines=5)
    url = reverse("datasets:import_detail", args=[job.id])
    page = editor_client.get(url)
    assert b"5 / 10 lines written" in page.content
    assert b'aria-valuenow="75"' in page.content  # checked: half; written: half of the rest
    assert f'hx-get="{url}"'.encode() in page.content
    partial = editor_client.get(url, headers={"HX-Request": "true"})
    assert partial.content.lstrip().startswith(b'<div id="import-status"')


@pytest.mark.django_db
def test_it_still_checks_csrf_on_the_upload(editor):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(editor)
    response = client.post(reverse(IMPORT_URL), {"file": _upload("rows.jsonl", [good_row()])})
    assert response.status_code == 403
    assert not DatasetImport.objects.exists()


def test_it_answers_before_an_oversize_upload_has_been_sent_in_full(live_server, editor, settings):
    """Over real HTTP: the server refuses the upload once it passes the limit, while the
    client still holds the rest of the body back."""
    import http.client
    from urllib.parse import urlsplit

    from django.test import Client

    settings.STUDIO_IMPORT_MAX_BYTES = 200_000
    client = Client()
    client.force_login(editor)
    session = client.cookies[settings.SESSION_COOKIE_NAME].value
    secret = "a" * 32
    boundary = "studio-boundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="csrfmiddlewaretoken"\r\n\r\n'
        f'{secret}\r\n--{boundary}\r\nContent-Disposition: form-data; name="file"; '
        f'filename="big.jsonl"\r\nContent-Type: application/octet-stream\r\n\r\n'
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    sent_first = 240_000  # past the limit, within the declared-length allowance
    held_back = 20_000
    declared = len(head) + sent_first + held_back + len(tail)
    url = urlsplit(live_server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=20)
    conn.putrequest("POST", reverse(IMPORT_URL))
    conn.putheader("Content-Type", f"multipart/form-data; boundary={boundary}")
    conn.putheader("Content-Length", str(declared))
    conn.putheader("Cookie", f"{settings.SESSION_COOKIE_NAME}={session}; csrftoken={secret}")
    conn.putheader("Referer", live_server.url)
    conn.endheaders()
    conn.send(head + b"x" * sent_first)
    response = conn.getresponse()  # the rest of the body was never sent
    body = response.read()
    conn.close()
    assert response.status == 400, body[:500]
    assert b"The file is larger than" in body
    assert not DatasetImport.objects.exists()
