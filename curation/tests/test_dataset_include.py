"""A dataset's include list: turns added from the turn list ("add to dataset": the ticked turns
or every turn the list's filter matches) are kept whatever the dataset's other filters say, in
its counts, its next version and its exports; earlier versions keep what they hold."""

from __future__ import annotations

import dataclasses

import pytest
from django.test import Client
from django.urls import reverse

from curation import services
from curation.export_options import ExportOptions
from curation.models import Dataset
from curation.selectors import dataset_counts
from curation.tests.conftest import read_rows, record, run
from rollouts.models import Episode, Turn
from rollouts.review.turn_selection import EVERY_TURN, TurnSelection, turns_selected

pytestmark = pytest.mark.django_db


def _ids(episode: Episode, *indexes: int) -> tuple[int, ...]:
    by_index = dict(episode.turns.values_list("index", "id"))
    return tuple(by_index[i] for i in indexes)


def _picked(*ids: int) -> TurnSelection:
    return dataclasses.replace(EVERY_TURN, turn_ids=ids)


@pytest.fixture
def two_batches(db) -> tuple[Episode, Episode]:
    kept = record(seeds=(1,), steps=4).episodes.get()
    other = record(seeds=(2,), steps=6).episodes.get()
    return kept, other


def _dataset(episode: Episode) -> Dataset:
    return services.dataset_create(
        name="wood", filters=TurnSelection(batches=(episode.batch_id,)), options=ExportOptions()
    )


def test_it_adds_a_selection_to_the_include_list_and_counts_it(two_batches):
    kept, other = two_batches
    dataset = _dataset(kept)
    picked = _ids(other, 1, 4)
    assert services.dataset_include_add(dataset=dataset, selection=_picked(*picked)) == 2
    assert TurnSelection.from_json(dataset.filters).include_turns == picked
    # Added again with one more: only the new one counts, the list keeps each once.
    more = _picked(*picked, *_ids(other, 5))
    assert services.dataset_include_add(dataset=dataset, selection=more) == 1
    filters = TurnSelection.from_json(dataset.filters)
    assert filters.include_turns == (*picked, *_ids(other, 5))
    selected = set(turns_selected(filters).values_list("id", flat=True))
    assert selected == set(kept.turns.values_list("id", flat=True)) | set(filters.include_turns)
    assert dataset_counts(filters=filters, options=ExportOptions())["turns"] == 4 + 3


def test_it_adds_every_turn_a_filter_matches(two_batches):
    kept, other = two_batches
    dataset = _dataset(kept)
    every = dataclasses.replace(EVERY_TURN, batches=(other.batch_id,))
    assert services.dataset_include_add(dataset=dataset, selection=every) == 6
    assert set(TurnSelection.from_json(dataset.filters).include_turns) == set(
        other.turns.values_list("id", flat=True)
    )


def test_the_include_list_is_bounded_and_nothing_is_written_past_it(two_batches, monkeypatch):
    kept, other = two_batches
    dataset = _dataset(kept)
    before = dict(dataset.filters)
    monkeypatch.setattr(services, "INCLUDE_TURNS_MAX", 5)
    every = dataclasses.replace(EVERY_TURN, batches=(other.batch_id,))
    with pytest.raises(ValueError, match="at most 5 turns by hand; 'wood' has 0 and more than 5"):
        services.dataset_include_add(dataset=dataset, selection=every)
    assert services.dataset_include_add(dataset=dataset, selection=_picked(*_ids(other, 0))) == 1
    with pytest.raises(ValueError, match="'wood' has 1 and 5 more were picked: narrow"):
        services.dataset_include_add(
            dataset=dataset, selection=_picked(*_ids(other, 1, 2, 3, 4, 5))
        )
    dataset.refresh_from_db()
    assert dataset.filters == {**before, "include_turns": list(_ids(other, 0))}


def test_versions_snapshot_the_list_and_editing_the_filter_keeps_it(two_batches, tmp_path):
    kept, other = two_batches
    dataset = _dataset(kept)
    first = services.dataset_version_create(dataset=dataset, enqueue=False)
    added = _ids(other, 3)
    services.dataset_include_add(dataset=dataset, selection=_picked(*added))
    second = services.dataset_version_create(dataset=dataset, enqueue=False)
    assert "include_turns" not in first.filters  # a version keeps what it was asked for
    assert second.filters["include_turns"] == list(added)
    assert services.dataset_version_export(version_id=second.id) == "done"
    second.refresh_from_db()
    assert (second.rows, second.episodes) == (5, 2)

    # The form has no include list: saving the filter keeps the dataset's.
    services.dataset_update(
        dataset=dataset,
        name="wood, renamed",
        filters=TurnSelection(batches=(kept.batch_id,), flagged="exclude"),
        options=ExportOptions(),
    )
    assert TurnSelection.from_json(dataset.filters).include_turns == added
    out = tmp_path / "rows.jsonl"
    result = run("export_jsonl", "--output", str(out), "--dataset", str(dataset.id))
    assert result.code == 0, result.stderr
    assert {(r["metadata"]["episode_id"], r["metadata"]["turn"]) for r in read_rows(out)} == {
        *((kept.id, i) for i in range(4)),
        (other.id, 3),
    }


def test_the_turn_lists_add_to_dataset_is_confirmed_then_done(two_batches, editor, viewer):
    kept, other = two_batches
    dataset = _dataset(kept)
    client = Client()
    client.force_login(editor)
    url = reverse("rollouts:turns_bulk")
    query = {"action": "dataset", "scope": "selection", "turn": _ids(other, 0, 2), "seed": "2"}
    confirm = client.get(url, query)
    html = confirm.content.decode()
    assert confirm.status_code == 200
    assert "<h1>Add 2 turns to a dataset?</h1>" in html
    assert f'<option value="{dataset.id}">wood</option>' in html
    assert TurnSelection.from_json(Dataset.objects.get().filters).include_turns == ()

    done = client.post(url, {**query, "target": dataset.id}, follow=True)
    assert done.redirect_chain[-1][0] == "/turns/?seed=2"
    assert "Added 2 turns to dataset &#x27;wood&#x27;." in done.content.decode()
    dataset.refresh_from_db()
    assert TurnSelection.from_json(dataset.filters).include_turns == _ids(other, 0, 2)

    # Every turn the filter matches; then a dataset that is not there, and no dataset.
    every = {"action": "dataset", "scope": "filter", "seed": "2", "target": dataset.id}
    assert "Add 6 turns to a dataset?" in client.get(url, every).content.decode()
    assert client.post(url, every).status_code == 302
    dataset.refresh_from_db()
    assert len(TurnSelection.from_json(dataset.filters).include_turns) == 6
    missing = client.post(url, {**every, "target": 424242})
    assert missing.status_code == 400
    assert "there is no dataset 424242" in missing.content.decode()
    unnamed = client.post(url, {**every, "target": ""})
    assert unnamed.status_code == 400 and "choose one" in unnamed.content.decode()

    looker = Client()
    looker.force_login(viewer)
    assert looker.post(url, {**every, "target": dataset.id}).status_code == 403
    assert not Turn.objects.filter(flagged=True).exists()


def test_the_dataset_page_shows_the_include_list_and_an_editor_clears_it(
    two_batches, editor, viewer
):
    kept, other = two_batches
    dataset = _dataset(kept)
    services.dataset_include_add(dataset=dataset, selection=_picked(*_ids(other, 1, 4)))
    url = reverse("datasets:dataset_detail", args=[dataset.id])
    looking = Client()
    looking.force_login(viewer)
    page = looking.get(url).content.decode()
    assert "<strong>Include list:</strong> 2 turns added" in page
    assert 'id="clear-include"' not in page  # looking is not editing
    assert looking.post(url, {"action": "clear_include"}).status_code == 403
    editing = Client()
    editing.force_login(editor)
    assert 'id="clear-include"' in editing.get(url).content.decode()
    response = editing.post(url, {"action": "clear_include"}, follow=True)
    assert "Include list cleared: 2 turn(s) no longer added." in response.content.decode()
    dataset.refresh_from_db()
    assert TurnSelection.from_json(dataset.filters).include_turns == ()
    assert 'id="include-list"' not in response.content.decode()
