"""The turn list: sortable columns, search over text, filters by policy, seed and reward."""

from __future__ import annotations

import pytest
from django.urls import reverse

from rollouts.models import Turn
from rollouts.tests.helpers import record_batch

pytestmark = pytest.mark.django_db


@pytest.fixture
def turns():
    scripted = record_batch(policy="scripted", seeds=(3, 4), steps=4)
    random = record_batch(policy="random", seeds=(4,), steps=4)
    first = Turn.objects.get(episode__batch=scripted, episode__seed=3, index=1)
    Turn.objects.filter(id=first.id).update(
        reward=1.0, model_text="I will chop the Tree now", note=""
    )
    Turn.objects.filter(episode__batch=random, index=2).update(reward=-0.5, note="ate a ZEBRA?")
    return scripted, random


def _rows(client, **params) -> list[tuple[int, int]]:
    response = client.get(reverse("rollouts:turn_list"), params)
    assert response.status_code == 200
    return [(t.episode.seed, t.index) for t in response.context["page"]]


def test_it_filters_by_policy_seed_and_reward(viewer_client, turns):
    assert len(_rows(viewer_client, policy="random")) == 4
    assert sorted(_rows(viewer_client, seed="4")) == [(4, i) for i in range(4) for _ in (0, 1)]
    assert _rows(viewer_client, reward="positive") == [(3, 1)]
    assert _rows(viewer_client, reward="negative") == [(4, 2)]
    assert len(_rows(viewer_client, reward="zero")) == 12 - 2
    assert _rows(viewer_client, policy="scripted", seed="4", reward="negative") == []


def test_it_searches_model_text_notes_and_observations(viewer_client, turns):
    # Case-insensitive, over the model's text and the note...
    assert _rows(viewer_client, q="CHOP") == [(3, 1)]
    assert _rows(viewer_client, q="zebra") == [(4, 2)]
    # ... and over the observation text (every turn states its health).
    assert len(_rows(viewer_client, q="health")) == 12


def test_it_sorts_by_its_columns(viewer_client, turns):
    by_reward = _rows(viewer_client, sort="-reward")
    assert by_reward[0] == (3, 1) and by_reward[-1] == (4, 2)
    assert _rows(viewer_client, sort="reward")[0] == (4, 2)
    assert [i for _, i in _rows(viewer_client, sort="-turn")][:3] == [3, 3, 3]
    assert [s for s, _ in _rows(viewer_client, sort="seed")][:4] == [3, 3, 3, 3]
    page = viewer_client.get(reverse("rollouts:turn_list"), {"sort": "reward", "q": "tree"})
    html = page.content.decode()
    assert 'aria-sort="ascending"' in html and "sort=-reward" in html and "q=tree" in html
    # An unknown sort key is the default order, not an error.
    assert viewer_client.get(reverse("rollouts:turn_list"), {"sort": "x;drop"}).status_code == 200
