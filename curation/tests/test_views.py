"""Dataset pages: permissions, live counts, preview with escaping, versions, download, import."""

from __future__ import annotations

import hashlib
import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from curation import services
from curation.export_options import ExportOptions
from curation.models import Dataset, DatasetVersion
from rollouts.review.turn_selection import TurnSelection

pytestmark = pytest.mark.django_db


def _dataset(batch) -> Dataset:
    return services.dataset_create(
        name="scripted <b>", filters=TurnSelection(batches=(batch.id,)), options=ExportOptions()
    )


def test_it_lets_viewers_look_but_not_edit(viewer_client, scripted_batch):
    dataset = _dataset(scripted_batch)
    assert viewer_client.get(reverse("datasets:dataset_list")).status_code == 200
    page = viewer_client.get(reverse("datasets:dataset_detail", args=[dataset.id]))
    assert page.status_code == 200
    assert b"scripted &lt;b&gt;" in page.content and b"scripted <b>" not in page.content
    assert viewer_client.get(reverse("datasets:dataset_new")).status_code == 403
    assert viewer_client.get(reverse("datasets:dataset_import")).status_code == 403
    post = viewer_client.post(reverse("datasets:version_create", args=[dataset.id]))
    assert post.status_code == 403
    edit = viewer_client.post(
        reverse("datasets:dataset_detail", args=[dataset.id]), {"name": "x", "flagged": "any"}
    )
    assert edit.status_code == 403
    assert DatasetVersion.objects.count() == 0


def test_it_requires_login(client, scripted_batch):
    response = client.get(reverse("datasets:dataset_list"))
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_it_creates_a_dataset_and_shows_live_counts(editor_client, scripted_batch):
    counts = editor_client.get(
        reverse("datasets:dataset_counts"),
        {
            "name": "x",
            "batches": [scripted_batch.id],
            "flagged": "any",
            "history_frames": "1",
            "format": "studio",
        },
        HTTP_HX_REQUEST="true",
    )
    assert b'data-count="turns">90<' in counts.content
    assert b'data-count="episodes">3<' in counts.content
    assert b'data-count="images">177<' in counts.content  # 90 frames + 87 history frames
    assert b"about" not in counts.content
    bad = editor_client.get(
        reverse("datasets:dataset_counts"),
        {
            "name": "x",
            "require_achievements": ["collect_woood"],
            "flagged": "any",
            "format": "studio",
        },
    )
    assert b"collect_woood" in bad.content and b"data-count" not in bad.content
    response = editor_client.post(
        reverse("datasets:dataset_new"),
        {
            "name": "wood",
            "batches": [scripted_batch.id],
            "flagged": "exclude",
            "format": "studio",
            "history_frames": "0",
            "val_fraction": "0.2",
        },
    )
    dataset = Dataset.objects.get(name="wood")
    assert response.status_code == 302
    assert dataset.filters["batches"] == [scripted_batch.id]
    assert dataset.filters["flagged"] == "exclude"
    assert dataset.export_options == {
        "history_frames": 0,
        "format": "studio",
        "val_fraction": 0.2,
        "allow_empty": False,
        "kind": "sft",
    }


def test_it_previews_rows_with_frame_images_and_escaped_model_text(
    editor_client, scripted_batch, tmp_path
):
    from curation.tests.conftest import run

    path = tmp_path / "evil.jsonl"
    row = {
        "messages": [
            {"role": "user", "content": "<img src=x onerror=alert(1)>"},
            {"role": "assistant", "content": "<script>alert('x')</script>"},
        ]
    }
    path.write_text(json.dumps(row) + "\n")
    summary = run("import_jsonl", str(path)).summary
    evil = editor_client.get(reverse("datasets:dataset_detail", args=[summary["dataset_id"]]))
    assert b"<script>alert" not in evil.content and b"<img src=x" not in evil.content
    assert b"&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in evil.content
    page = editor_client.get(reverse("datasets:dataset_detail", args=[_dataset(scripted_batch).id]))
    frame = scripted_batch.episodes.order_by("seed").first().turns.get(index=0).frame
    assert reverse("rollouts:frame_image", args=[frame.sha256]).encode() in page.content
    assert b"interact_many" in page.content


def test_it_exports_a_version_and_downloads_the_exact_file(
    editor_client, viewer, scripted_batch, client
):
    dataset = _dataset(scripted_batch)
    response = editor_client.post(reverse("datasets:version_create", args=[dataset.id]))
    assert response.status_code == 302
    version = DatasetVersion.objects.get(dataset=dataset)
    assert version.status == DatasetVersion.Status.PENDING
    progress = editor_client.get(reverse("datasets:dataset_versions", args=[dataset.id]))
    assert b'hx-trigger="every' in progress.content
    # What the Celery task runs (the worker itself is covered in test_versions).
    assert services.dataset_version_export(version_id=version.id) == "done"
    version.refresh_from_db()
    client.force_login(viewer)
    download = client.get(reverse("datasets:version_download", args=[version.id]))
    assert download.status_code == 200
    body = b"".join(download.streaming_content)

    assert hashlib.sha256(body).hexdigest() == version.sha256
    assert len(body.splitlines()) == version.rows == 90
    assert "attachment" in download["Content-Disposition"]
    page = client.get(reverse("datasets:dataset_versions", args=[dataset.id]))
    assert version.sha256[:8].encode() in page.content and b"every" not in page.content


def test_it_says_about_when_live_counts_are_estimated(editor_client, scripted_batch, settings):
    from django.db import connection

    from rollouts.review.turn_selection import TurnSelection, turns_selected

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
        # What PostgreSQL's planner expects the filter to match (its estimate of the join of
        # turns and episodes is not exact), asked here directly.
        sql, params = turns_selected(TurnSelection()).values("pk").query.sql_with_params()
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    planned = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]["Plan Rows"]
    settings.STUDIO_EXACT_COUNT_UP_TO = 30  # the 90 turns of 3 episodes are past it
    query = {"name": "x", "flagged": "any", "history_frames": "1", "format": "studio"}
    counts = editor_client.get(reverse("datasets:dataset_counts"), query)
    assert b"about</span>" in counts.content
    # Turns: the planner's figure, but never fewer than the 31 read; episodes: all 3
    # episodes x turns / 90 (all turns, once analysed); images per turn from the turns read
    # (90 frames + 87 history frames over 90 turns). Two-figure numbers are shown as they are.
    turns = max(planned, 31)
    assert f'data-count="turns" data-estimated="true">{turns}<'.encode() in counts.content
    episodes = max(1, min(turns, round(3 * turns / 90)))
    assert f'data-count="episodes">{episodes}<'.encode() in counts.content
    assert f'data-count="images">{round(177 * turns / 90)}<'.encode() in counts.content


def test_live_counts_are_exact_up_to_the_bound_and_about_past_it(
    editor_client, scripted_batch, settings
):
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    query = {"name": "x", "flagged": "any", "history_frames": "0", "format": "studio"}
    settings.STUDIO_EXACT_COUNT_UP_TO = 90  # the fixture's 3 episodes x 30 turns: all read
    exact = editor_client.get(reverse("datasets:dataset_counts"), query).content.decode()
    assert "about</span>" not in exact and 'data-estimated="true"' not in exact
    assert '<strong data-count="turns">90</strong>' in exact
    assert '<strong data-count="episodes">3</strong>' in exact
    settings.STUDIO_EXACT_COUNT_UP_TO = 89
    about = editor_client.get(reverse("datasets:dataset_counts"), query).content.decode()
    assert "about</span>" in about and 'data-estimated="true"' in about


def test_it_names_an_import_after_the_uploaded_file_and_shows_its_tool_calls(editor_client):
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "interact_many", "arguments": '{"actions": ["do"]}'},
    }
    row = {
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
        ]
    }
    upload = SimpleUploadedFile("my-rows.jsonl", (json.dumps(row) + "\n").encode() * 2)
    assert (
        editor_client.post(reverse("datasets:dataset_import"), {"file": upload}).status_code == 302
    )
    # What the worker does with it (curation.tasks.dataset_import_run).
    from curation.models import DatasetImport
    from curation.services_import import dataset_import_run

    assert dataset_import_run(job_id=DatasetImport.objects.get().id) == "done"
    dataset = Dataset.objects.get()
    assert (dataset.name, dataset.description) == ("my-rows.jsonl", "Imported from my-rows.jsonl")
    from rollouts.models import Episode, RolloutBatch

    batch = RolloutBatch.objects.get()
    assert batch.settings["imported_from"] == "my-rows.jsonl"
    assert sum(Episode.objects.filter(batch=batch).values_list("tool_calls", flat=True)) == 2
    page = editor_client.get(reverse("rollouts:batch_detail", args=[batch.id])).content.decode()
    assert "crafter ?" not in page and "Imported from" in page
    assert 'data-action="resume"' not in page and 'data-action="run-again"' not in page
