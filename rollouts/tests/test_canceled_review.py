"""A canceled episode's turns are kept and reviewable, marked as such in the turn list and the
episode viewer."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from rollouts.models import Episode
from rollouts.review.turn_selection import EVERY_TURN, TurnSelection, turns_selected
from rollouts.tests.helpers import record_batch

pytestmark = pytest.mark.django_db


@pytest.fixture
def canceled_batch():
    batch = record_batch(seeds=(1, 2), steps=4)
    # What the batch's Cancel leaves on an episode it stopped: its status, its turns kept.
    Episode.objects.filter(batch=batch, seed=2).update(status=Episode.Status.CANCELED)
    return batch


def test_the_turn_list_shows_a_canceled_episodes_turns_marked(canceled_batch, viewer_client):
    canceled = canceled_batch.episodes.get(seed=2)
    page = viewer_client.get(reverse("rollouts:turn_list"), {"batch": canceled_batch.id})
    rows = [r for r in re.findall(r"<tr>.*?</tr>", page.content.decode(), re.S) if "<td" in r]
    marked = [row for row in rows if "data-canceled" in row]
    assert len(rows) == 8 and len(marked) == 4
    assert all(f">{canceled.id}</a>" in row for row in marked)
    # Every turn on the turn list, only the dataset default leaves them out.
    assert turns_selected(EVERY_TURN).filter(episode=canceled).count() == 4
    assert not turns_selected(TurnSelection()).filter(episode=canceled).exists()


def test_the_viewer_says_the_episode_was_canceled(canceled_batch, viewer_client):
    canceled = canceled_batch.episodes.get(seed=2)
    page = viewer_client.get(reverse("rollouts:episode_detail", args=[canceled.id]))
    text = page.content.decode()
    assert "Canceled: its batch's Cancel stopped this episode after 4 turns." in text
    assert "canceled episode</span>" in text
    finished = canceled_batch.episodes.get(seed=1)
    other = viewer_client.get(reverse("rollouts:episode_detail", args=[finished.id]))
    assert "data-canceled" not in other.content.decode()


def test_batch_report_counts_canceled_episodes_apart(canceled_batch):
    import io
    import json

    from django.core.management import call_command

    out = io.StringIO()
    call_command("batch_report", str(canceled_batch.id), stdout=out)
    assert "1 finished, 0 failed, 1 canceled of 2" in out.getvalue().splitlines()[0]
    out = io.StringIO()
    call_command("batch_report", str(canceled_batch.id), "--json", stdout=out)
    report = json.loads(out.getvalue())
    assert (report["finished"], report["failed"], report["canceled"]) == (1, 0, 1)
