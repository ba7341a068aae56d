"""What a reinforcement-learning run leaves on its episodes and turns (`Episode.rl_reward`,
`Turn.advantage`) as the viewer, the turn list and the batch page show it, from what the
rollouts themselves hold (the batch's name, which the GRPO worker sets); nothing is shown of
them for any other episode."""

from __future__ import annotations

import pytest

from rollouts.models import Episode, RolloutBatch, Turn
from rollouts.tests.helpers import seed_episode

pytestmark = pytest.mark.django_db


@pytest.fixture
def rl_episode() -> Episode:
    episode = seed_episode(turns=3, observation="obs {i}", model_text="text {i}")
    RolloutBatch.objects.filter(id=episode.batch_id).update(name="GRPO job 7, iteration 2")
    Episode.objects.filter(id=episode.id).update(rl_reward=1.25)
    Turn.objects.filter(episode=episode).update(advantage=-0.5)
    episode.refresh_from_db()
    return episode


def test_the_viewer_shows_the_rl_reward_and_the_advantage(viewer_client, rl_episode):
    page = viewer_client.get(f"/episodes/{rl_episode.id}/").content.decode()
    assert '<dd id="rl-reward">1.250</dd>' in page
    assert '<dd id="advantage">-0.500 <span class="muted small">each turn</span></dd>' in page
    turn = viewer_client.get(f"/episodes/{rl_episode.id}/turns/1/").json()
    assert turn["advantage"] == -0.5


def test_advantages_that_differ_by_turn_are_shown_as_their_range(viewer_client, rl_episode):
    Turn.objects.filter(episode=rl_episode, index=2).update(advantage=0.75)
    page = viewer_client.get(f"/episodes/{rl_episode.id}/").content.decode()
    assert '<dd id="advantage">-0.500 to 0.750 <span class="muted small">by turn</span>' in page


def test_any_other_episode_shows_neither(viewer_client):
    episode = seed_episode(turns=2, observation="obs {i}", model_text="text {i}")
    page = viewer_client.get(f"/episodes/{episode.id}/").content.decode()
    assert 'id="rl-reward"' not in page and 'id="advantage"' not in page
    assert viewer_client.get(f"/episodes/{episode.id}/turns/0/").json()["advantage"] is None
    batch = viewer_client.get(f"/rollouts/{episode.batch_id}/").content.decode()
    assert 'id="grpo-batch"' not in batch and "data-rl-reward" not in batch


def test_the_batch_page_says_it_is_a_grpo_iteration(viewer_client, rl_episode):
    page = viewer_client.get(f"/rollouts/{rl_episode.batch_id}/").content.decode()
    assert '<dd id="grpo-batch">GRPO job 7, iteration 2: its episodes' in page
    assert '<td class="num" data-rl-reward>1.250</td>' in page


def test_the_turn_list_shows_the_advantage_beside_the_reward(viewer_client, rl_episode):
    page = viewer_client.get(f"/turns/?batch={rl_episode.batch_id}").content.decode()
    assert page.count("data-advantage") == 3
    assert "adv -0.500" in page
