"""Rows that must not teach the wrong thing: text-fallback turns, empty exports and splits."""

from __future__ import annotations

import pytest
from django.urls import reverse

from curation import services
from curation.export_options import ExportOptions
from curation.models import DatasetVersion
from curation.tests.conftest import read_rows, record, run
from rollouts.models import Turn
from rollouts.review.turn_selection import TurnSelection
from rollouts.tests import openai_server as replies
from studio.testing import JOB_ENDS, wait_for_row

pytestmark = pytest.mark.django_db


@pytest.fixture
def fallback_batch(chat_server):
    """Three turns: a tool call, prose naming an action (text fallback), a tool call."""
    chat_server.script(
        replies.tool_call("move_left"),
        replies.text("I will go right now: move_right"),
        replies.tool_call("do"),
    )
    batch = record(policy="openai", model="test-vlm", base_url=chat_server.url, seeds=(4,), steps=3)
    assert list(Turn.objects.order_by("index").values_list("text_fallback", flat=True)) == [
        False,
        True,
        False,
    ]
    return batch


def test_it_leaves_text_fallback_turns_out_of_a_default_export(fallback_batch, tmp_path):
    out = tmp_path / "rows.jsonl"
    result = run("export_jsonl", "--output", str(out), "--allow-empty")
    assert result.code == 0, result.stderr
    rows = read_rows(out)
    assert [r["metadata"]["turn"] for r in rows] == [0, 2]
    assert all("text_fallback" not in r["metadata"] for r in rows)
    assert result.summary["rows"] == 2


def test_it_includes_them_marked_when_asked(fallback_batch, tmp_path):
    out = tmp_path / "rows.jsonl"
    result = run("export_jsonl", "--output", str(out), "--include-text-fallback")
    assert result.code == 0, result.stderr
    rows = read_rows(out)
    assert [r["metadata"]["turn"] for r in rows] == [0, 1, 2]
    marked = rows[1]
    assert marked["metadata"]["text_fallback"] is True
    assert list(marked["metadata"])[-1] == "text_fallback"
    # The model's own prose stays beside the inferred call.
    assert marked["messages"][-1]["content"] == "I will go right now: move_right"
    assert "text_fallback" not in rows[0]["metadata"]


def test_it_refuses_text_fallback_rows_in_the_openai_format(fallback_batch, tmp_path):
    out = tmp_path / "rows.jsonl"
    args = ("--output", str(out), "--include-text-fallback", "--format", "openai")
    result = run("export_jsonl", *args)
    assert result.code == 2 and "no metadata to mark" in result.stderr
    assert not out.exists()


def test_it_counts_a_dataset_without_them_unless_asked(fallback_batch, editor_client):
    url = reverse("datasets:dataset_counts")
    base = {"name": "x", "flagged": "any", "format": "studio", "history_frames": "0"}
    without = editor_client.get(url, base)
    assert 'data-count="turns">2<' in without.content.decode()
    with_them = editor_client.get(url, {**base, "include_text_fallback": "on"})
    assert 'data-count="turns">3<' in with_them.content.decode()


def test_it_exits_1_and_writes_nothing_when_nothing_matches(scripted_batch, tmp_path):
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "rows.jsonl"
    result = run("export_jsonl", "--output", str(out), "--min-reward", "1000")
    assert result.code == 1
    assert "no rows to export" in result.stderr and "--allow-empty" in result.stderr
    assert not out.exists() and list(out.parent.iterdir()) == []
    allowed = run("export_jsonl", "--output", str(out), "--min-reward", "1000", "--allow-empty")
    assert allowed.code == 0 and allowed.summary["rows"] == 0
    assert out.read_bytes() == b""


def test_it_warns_when_the_validation_split_is_empty(scripted_batch, tmp_path):
    out = tmp_path / "rows.jsonl"
    # 3 episodes; no (batch, seed) hash falls below one in a billion.
    result = run("export_jsonl", "--output", str(out), "--val-fraction", "0.000000001")
    assert result.code == 0
    assert "validation split has 0 rows" in result.stderr
    assert result.summary["rows"] == 90 and result.summary["val"]["rows"] == 0


def test_it_fails_an_empty_version_with_the_reason_unless_allowed(celery_worker):
    batch = record(seeds=(1,), steps=3)
    dataset = services.dataset_create(
        name="nothing",
        filters=TurnSelection(batches=(batch.id,), min_reward=1000.0),
        options=ExportOptions(),
    )
    version = wait_for_row(
        services.dataset_version_create(dataset=dataset), statuses=JOB_ENDS, timeout=120
    )
    assert version.status == DatasetVersion.Status.FAILED
    assert "no rows to export" in version.error and not version.sha256
    dataset.export_options = ExportOptions(allow_empty=True).to_json()
    dataset.save()
    allowed = wait_for_row(
        services.dataset_version_create(dataset=dataset), statuses=JOB_ENDS, timeout=120
    )
    assert allowed.status == DatasetVersion.Status.DONE and allowed.rows == 0


def test_it_refuses_to_save_an_openai_dataset_under_ten_rows(scripted_batch, editor_client):
    data = {
        "name": "too small",
        "batches": [scripted_batch.id],
        "flagged": "only",
        "format": "openai",
        "history_frames": "0",
    }
    Turn.objects.filter(index__lt=4, episode__seed=1).update(flagged=True)
    response = editor_client.post(reverse("datasets:dataset_new"), data)
    assert response.status_code == 200
    assert "at least 10 rows" in response.content.decode()
    assert "this filter selects 4" in response.content.decode()
    counts = editor_client.get(reverse("datasets:dataset_counts"), data).content.decode()
    assert "at least 10 rows" in counts
    Turn.objects.filter(index__lt=10, episode__seed=1).update(flagged=True)
    assert editor_client.post(reverse("datasets:dataset_new"), data).status_code == 302


def test_it_warns_on_the_page_when_a_versions_validation_split_is_empty(
    scripted_batch, editor_client
):
    dataset = services.dataset_create(
        name="tiny val",
        filters=TurnSelection(batches=(scripted_batch.id,)),
        options=ExportOptions(val_fraction=0.000000001),
    )
    version = services.dataset_version_create(dataset=dataset, enqueue=False)
    assert services.dataset_version_export(version_id=version.id) == "done"
    version.refresh_from_db()
    assert version.rows == 90 and version.split["val"]["rows"] == 0
    page = editor_client.get(reverse("datasets:dataset_detail", args=[dataset.id]))
    html = page.content.decode()
    assert "the validation split has 0 rows" in html
    assert "The validation split has 0 rows: no episode falls into it." in html  # live counts
