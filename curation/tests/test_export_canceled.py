"""Datasets leave canceled episodes out by default: what a canceled episode
played is kept and reviewable, but it ended where nobody chose to end it."""

from __future__ import annotations

import pytest

from curation.tests.conftest import read_rows, record, run
from rollouts.models import Episode
from rollouts.review.turn_selection import TurnSelection, turns_selected

pytestmark = pytest.mark.django_db


def _batch_with_a_canceled_episode():
    batch = record(seeds=(1, 2), steps=5)
    # What the batch's Cancel leaves on an episode it stopped: its status, its turns kept.
    canceled = Episode.objects.get(batch=batch, seed=2)
    Episode.objects.filter(id=canceled.id).update(status=Episode.Status.CANCELED, error="canceled")
    return batch, Episode.objects.get(batch=batch, seed=1), canceled


def test_it_exports_no_turn_of_a_canceled_episode_unless_asked(tmp_path):
    batch, finished, canceled = _batch_with_a_canceled_episode()
    assert canceled.turns.count() == 5  # kept, and reviewable

    out = tmp_path / "rows.jsonl"
    done = run("export_jsonl", "--output", str(out), "--batch", str(batch.id))
    assert done.code == 0, done.stderr
    assert (done.summary["rows"], done.summary["episodes"]) == (5, 1)
    assert {row["metadata"]["episode_id"] for row in read_rows(out)} == {finished.id}

    out = tmp_path / "with-canceled.jsonl"
    done = run("export_jsonl", "--output", str(out), "--batch", str(batch.id), "--include-canceled")
    assert done.code == 0, done.stderr
    assert (done.summary["rows"], done.summary["episodes"]) == (10, 2)
    assert {row["metadata"]["episode_id"] for row in read_rows(out)} == {
        finished.id,
        canceled.id,
    }


def test_a_dataset_saved_before_the_option_leaves_them_out_and_keeps_its_json():
    batch, finished, canceled = _batch_with_a_canceled_episode()
    # A dataset's stored filter has no include_canceled key: the default applies.
    stored = TurnSelection.from_json({"batches": [batch.id], "flagged": "any"})
    assert set(turns_selected(stored).values_list("episode_id", flat=True)) == {finished.id}
    assert "include_canceled" not in stored.to_json()  # its bytes unchanged
    asked = TurnSelection(batches=(batch.id,), include_canceled=True)
    assert asked.to_json()["include_canceled"] is True
    assert set(turns_selected(asked).values_list("episode_id", flat=True)) == {
        finished.id,
        canceled.id,
    }
