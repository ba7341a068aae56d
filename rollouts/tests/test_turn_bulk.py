"""Bulk work on the turn list: a selection of ticked turns (`turn_ids`) or the list's filter,
flagged, unflagged or noted; a dataset's include list (`include_turns`) in `turns_selected`.
The services here; the pages through the real views; "add to dataset" in
curation/tests/test_dataset_include.py."""

from __future__ import annotations

import dataclasses

import pytest
from django.test import Client
from django.urls import reverse

from rollouts.models import Episode, Turn, TurnBulkFlag
from rollouts.review import services as review
from rollouts.review import views as review_views
from rollouts.review.turn_selection import (
    EVERY_TURN,
    TURN_IDS_MAX,
    FilterError,
    TurnSelection,
    selection_summary,
    turns_selected,
)
from rollouts.tests.helpers import record_batch
from studio.testing import JOB_ENDS, wait_for_row

pytestmark = pytest.mark.django_db


def _episodes(steps: int, seeds: tuple[int, ...]) -> list[Episode]:
    batch = record_batch(seeds=seeds, steps=steps)
    return list(batch.episodes.order_by("seed"))


def _ids(episode: Episode, *indexes: int) -> tuple[int, ...]:
    by_index = dict(episode.turns.values_list("index", "id"))
    return tuple(by_index[i] for i in indexes)


def _picked(*ids: int) -> TurnSelection:
    return dataclasses.replace(EVERY_TURN, turn_ids=ids)


# --- the declaration and the query ---------------------------------------------------------


def test_turn_ids_select_these_turns_and_nothing_else(db):
    one, two = _episodes(5, seeds=(1, 2))
    ids = _ids(one, 1, 3) + _ids(two, 0)
    assert set(turns_selected(_picked(*ids)).values_list("id", flat=True)) == set(ids)
    # With the other filters of the selection, as every filter is.
    narrowed = dataclasses.replace(_picked(*ids), seeds=(1,))
    assert set(turns_selected(narrowed).values_list("id", flat=True)) == set(ids[:2])
    assert selection_summary(_picked(*ids)) == [("turns", ", ".join(map(str, ids)))]


def test_turn_ids_are_bounded_and_stored_only_when_given():
    with pytest.raises(FilterError, match=f"turns: at most {TURN_IDS_MAX:,} turns, not"):
        _picked(*range(1, TURN_IDS_MAX + 2))
    with pytest.raises(FilterError, match="turns: turn ids are integers from 1"):
        _picked(0)
    # A selection without them stores what it stored before they existed (a dataset's JSON,
    # a version's snapshot, a Hugging Face card).
    assert "turn_ids" not in TurnSelection().to_json()
    assert "include_turns" not in TurnSelection().to_json()
    picked = _picked(5, 7)
    assert picked.to_json()["turn_ids"] == [5, 7]
    assert TurnSelection.from_json(picked.to_json()) == picked
    long = selection_summary(_picked(*range(1, 31)))
    assert long == [("turns", "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, … (30 turns)")]


def test_the_include_list_keeps_its_turns_whatever_the_other_filters(db):
    kept, other = _episodes(4, seeds=(1, 2))
    extra = _ids(other, 2)
    Turn.objects.filter(episode=kept, index=1).update(flagged=True)
    dataset_like = TurnSelection(
        batches=(kept.batch_id,), seeds=(1,), flagged="only", include_turns=extra
    )
    selected = set(turns_selected(dataset_like).values_list("id", flat=True))
    assert selected == set(_ids(kept, 1) + extra)
    # The turn list's ways of reading pages agree (an array of episodes, a joined episode).
    for options in ({"for_pages": True}, {"episode_joined": True}):
        assert set(turns_selected(dataset_like, **options).values_list("id", flat=True)) == (
            selected
        )
    assert turns_selected(dataset_like).count() == 2


# --- the services ------------------------------------------------------------------------------


def test_a_bulk_flag_of_a_selection_flags_and_unflags_those_turns_only(db, editor):
    one, two = _episodes(6, seeds=(1, 2))
    ids = _ids(one, 0, 1, 2) + _ids(two, 5)
    Turn.objects.filter(id=ids[0]).update(flagged=True)  # already flagged: stays as it is
    job = review.turn_bulk_flag_start(filters=_picked(*ids), flagged=True, user=editor)
    assert job.total == 3
    assert review.turn_bulk_flag_run(job_id=job.id) == "done"
    job.refresh_from_db()
    assert (job.status, job.changed) == ("done", 3)
    assert set(Turn.objects.filter(flagged=True).values_list("id", flat=True)) == set(ids)

    undo = review.turn_bulk_flag_start(filters=_picked(*ids[1:3]), flagged=False, user=editor)
    assert review.turn_bulk_flag_run(job_id=undo.id) == "done"
    assert set(Turn.objects.filter(flagged=True).values_list("id", flat=True)) == {ids[0], ids[3]}


def test_a_bulk_flag_of_the_filter_flags_every_match(db, editor):
    one, two = _episodes(6, seeds=(1, 2))
    job = review.turn_bulk_flag_start(
        filters=dataclasses.replace(EVERY_TURN, seeds=(2,)), flagged=True, user=editor
    )
    assert review.turn_bulk_flag_run(job_id=job.id) == "done"
    assert two.turns.filter(flagged=True).count() == 6
    assert not one.turns.filter(flagged=True).exists()


def test_a_bulk_note_sets_one_note_on_a_selection_or_on_the_filter(db, editor):
    one, two = _episodes(4, seeds=(1, 2))
    ids = _ids(one, 1, 2)
    assert (
        review.turns_note_set(selection=_picked(*ids), note="  walks into lava\r\n", user=editor)
        == 2
    )
    noted = Turn.objects.exclude(note="")
    assert set(noted.values_list("id", "note")) == {(i, "walks into lava") for i in ids}
    assert set(noted.values_list("reviewed_by", flat=True)) == {editor.id}

    every = dataclasses.replace(EVERY_TURN, seeds=(2,))
    assert review.turns_note_set(selection=every, note="seed 2", user=editor) == 4
    assert set(two.turns.values_list("note", flat=True)) == {"seed 2"}
    # Empty clears them.
    assert review.turns_note_set(selection=_picked(*ids), note="", user=editor) == 2
    assert set(one.turns.values_list("note", flat=True)) == {""}


def test_a_bulk_note_is_bounded_like_a_note_and_in_turns(db, editor, monkeypatch):
    (one,) = _episodes(5, seeds=(1,))
    with pytest.raises(ValueError, match="note: longer than 10000 characters"):
        review.turns_note_set(selection=_picked(*_ids(one, 0)), note="x" * 10_001, user=editor)
    monkeypatch.setattr(review, "BULK_NOTE_MAX_TURNS", 4)
    with pytest.raises(ValueError, match=r"more than 4 turns match; .* narrow the filter"):
        review.turns_note_set(selection=EVERY_TURN, note="too many", user=editor)
    assert not Turn.objects.exclude(note="").exists()  # nothing written


# --- the pages -----------------------------------------------------------------------------------


@pytest.fixture
def looker(viewer) -> Client:
    """A viewer's own client (`viewer_client` and `editor_client` share one)."""
    client = Client()
    client.force_login(viewer)
    return client


def test_the_turn_list_has_a_checkbox_per_row_and_the_bar_for_reviewers(looker, editor_client):
    (one,) = _episodes(3, seeds=(1,))
    page = editor_client.get(reverse("rollouts:turn_list"), {"seed": "1", "sort": "-turn"})
    html = page.content.decode()
    for turn_id in _ids(one, 0, 1, 2):
        assert f'name="turn" value="{turn_id}" form="turn-bulk"' in html
    assert 'data-select-page aria-label="Tick every turn on this page"' in html
    assert '<form id="turn-bulk" class="bulk-bar" method="get" action="/turns/bulk/"' in html
    # The bar carries the list's filters and order to the confirmation.
    assert '<input type="hidden" name="seed" value="1">' in html
    assert '<input type="hidden" name="sort" value="-turn">' in html
    for action in ("flag", "unflag", "note", "dataset"):
        assert f'name="action" value="{action}"' in html
    assert "rollouts/turn_list.js" in html
    # A viewer changes nothing: no boxes, no bar.
    looked = looker.get(reverse("rollouts:turn_list")).content.decode()
    assert 'name="turn"' not in looked and "turn-bulk" not in looked


def test_a_selection_is_confirmed_with_its_count_then_noted(editor_client, editor):
    one, two = _episodes(4, seeds=(1, 2))
    ids = _ids(one, 0, 1, 3)
    url = reverse("rollouts:turns_bulk")
    query = {"action": "note", "scope": "selection", "turn": ids, "seed": "1", "sort": "-turn"}
    confirm = editor_client.get(url, query)
    assert confirm.status_code == 200
    html = confirm.content.decode()
    assert "<h1>Set a note on 3 turns?</h1>" in html
    assert "Only the turns you ticked on the list." in html
    for turn_id in ids:
        assert f'<input type="hidden" name="turn" value="{turn_id}">' in html
    assert not Turn.objects.exclude(note="").exists()  # a GET changes nothing

    done = editor_client.post(url, {**query, "note": "stuck at the river"}, follow=True)
    assert done.redirect_chain[-1][0] == "/turns/?seed=1&sort=-turn"
    assert "Note set on 3 turns." in done.content.decode()
    assert set(Turn.objects.exclude(note="").values_list("id", flat=True)) == set(ids)
    assert not two.turns.exclude(note="").exists()


def test_every_match_is_confirmed_with_the_filters_and_their_count(editor_client):
    _episodes(30, seeds=(1, 2))
    url = reverse("rollouts:turns_bulk")
    confirm = editor_client.get(url, {"action": "note", "scope": "filter", "seed": "2"})
    html = confirm.content.decode()
    assert "<h1>Set a note on 30 turns?</h1>" in html
    assert "<li>seed: 2</li>" in html
    done = editor_client.post(url, {"action": "note", "scope": "filter", "seed": "2", "note": "n"})
    assert done.status_code == 302
    assert Turn.objects.filter(note="n", episode__seed=2).count() == 30
    assert not Turn.objects.filter(episode__seed=1).exclude(note="").exists()


def test_a_selection_is_flagged_on_the_worker_after_a_confirmation(client, editor, celery_worker):
    client.force_login(editor)
    one, two = _episodes(4, seeds=(1, 2))
    ids = _ids(one, 1, 2) + _ids(two, 3)
    url = reverse("rollouts:turns_bulk")
    query = {"action": "flag", "scope": "selection", "turn": ids}
    assert "<h1>Flag 3 turns?</h1>" in client.get(url, query).content.decode()
    done = client.post(url, query)
    job = TurnBulkFlag.objects.get()
    assert done["Location"] == reverse("rollouts:turn_bulk_flag_detail", args=[job.id])
    job = wait_for_row(job, statuses=JOB_ENDS)
    assert (job.status, job.changed) == ("done", 3)
    assert set(Turn.objects.filter(flagged=True).values_list("id", flat=True)) == set(ids)
    unflag = client.post(url, {**query, "action": "unflag", "turn": ids[:1]})
    assert unflag.status_code == 302
    assert wait_for_row(TurnBulkFlag.objects.latest("id"), statuses=JOB_ENDS).changed == 1
    assert set(Turn.objects.filter(flagged=True).values_list("id", flat=True)) == set(ids[1:])


def test_bulk_actions_refuse_what_is_not_there_and_need_the_permission(
    looker, editor_client, monkeypatch
):
    (one,) = _episodes(5, seeds=(1,))
    url = reverse("rollouts:turns_bulk")
    nothing = editor_client.get(url, {"action": "flag", "scope": "selection"})
    assert nothing.status_code == 400
    assert "No turn is ticked" in nothing.content.decode()
    assert editor_client.get(url, {"action": "burn", "turn": _ids(one, 0)}).status_code == 400
    assert editor_client.get(url, {"action": "flag", "turn": "x"}).status_code == 400
    assert editor_client.get(url, {"action": "flag", "turn": "0"}).status_code == 400
    too_many = editor_client.get(
        url, {"action": "flag", "turn": [str(i) for i in range(1, TURN_IDS_MAX + 2)]}
    )
    assert too_many.status_code == 400
    assert f"at most {TURN_IDS_MAX:,} turns" in too_many.content.decode()
    # Past the note's bound: said on the confirmation, and a POST writes nothing.
    monkeypatch.setattr(review, "BULK_NOTE_MAX_TURNS", 3)
    monkeypatch.setitem(review_views._BULK_LIMITS, "note", 3)
    confirm = editor_client.get(url, {"action": "note", "scope": "filter"}).content.decode()
    assert (
        "More than 3 turns match" in confirm and 'type="submit"' not in confirm.split("<main>")[1]
    )
    refused = editor_client.post(url, {"action": "note", "scope": "filter", "note": "x"})
    assert refused.status_code == 400
    assert "more than 3 turns match" in refused.content.decode()
    assert not Turn.objects.exclude(note="").exists()
    # A viewer may look at the list, never change it.
    for method in (looker.get, looker.post):
        assert method(url, {"action": "flag", "turn": _ids(one, 0)}).status_code == 403
    assert not Turn.objects.filter(flagged=True).exists()
