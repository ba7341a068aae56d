"""/leaderboard/ and the held-out seed reads that the training page's Evaluate builds on."""

from __future__ import annotations

import pytest

from curation.models import Dataset, DatasetVersion
from evaluation import selectors
from evaluation.statistics import summarize
from rollouts.game.crafter_env import ACHIEVEMENTS
from rollouts.models import Episode, RolloutBatch
from rollouts.review.turn_selection import TurnSelection, turns_selected
from rollouts.tests.helpers import record_batch

pytestmark = pytest.mark.django_db


def _finished_batch(*, seeds, policy="openai", model="vlm-a", unlocked=(), **settings):
    batch = RolloutBatch.objects.create(
        policy=policy,
        model=model if policy == "openai" else "",
        seeds=list(seeds),
        status="finished",
        settings={"observation_mode": "image_text", "history_frames": 0, **settings},
    )
    Episode.objects.bulk_create(
        Episode(batch=batch, seed=s, status="finished", achievements=dict.fromkeys(unlocked, 1))
        for s in seeds
    )
    return batch


def test_it_pools_batches_of_one_configuration_and_keeps_others_apart(viewer_client):
    one = _finished_batch(seeds=range(0, 5), unlocked=["collect_wood"])
    two = _finished_batch(seeds=range(5, 10), unlocked=["collect_wood"])
    text = _finished_batch(seeds=range(0, 5), observation_mode="text")
    RolloutBatch.objects.create(policy="openai", model="vlm-a", seeds=[1], status="running")
    rows = selectors.leaderboard_rows()
    studio = [row for row in rows if not row.is_reference]
    assert [sorted(row.batch_ids) for row in studio] == [[one.id, two.id], [text.id]]
    pooled = studio[0]
    assert pooled.summary.episodes == 10
    # collect_wood in every episode, nothing else: 101 ** (1/22) - 1 = 0.2334%.
    assert pooled.summary.crafter_score == pytest.approx(0.2334, abs=1e-4)
    assert pooled.summary.progression == pytest.approx(100 / 22)
    assert studio[1].observation_mode == "text" and studio[1].summary.crafter_score == 0.0


def test_the_papers_agents_are_shown_as_references(viewer_client):
    _finished_batch(seeds=range(3), unlocked=ACHIEVEMENTS[:3])
    response = viewer_client.get("/leaderboard/")
    assert response.status_code == 200
    ranks = [rank for rank, _ in response.context["rows"]]
    rows = [row for _, row in response.context["rows"]]
    assert sorted(r for r in ranks if r is not None) == [1]
    references = {row.label: row.score for row in rows if row.is_reference}
    assert references == {
        "Human experts": 50.5,
        "DreamerV2": 10.0,
        "PPO": 4.6,
        "Rainbow": 4.3,
        "Random": 1.6,
    }
    assert [row.score for row in rows] == sorted((row.score for row in rows), reverse=True)
    html = response.content.decode()
    assert html.count('class="reference"') == 5
    assert "not a studio result" in html and "50.50%" in html


def test_the_leaderboard_renders_with_no_batches_and_counts_failures(viewer_client):
    assert "No finished batches yet" in viewer_client.get("/leaderboard/").content.decode()
    batch = _finished_batch(seeds=range(4), unlocked=["collect_wood"])
    Episode.objects.filter(batch=batch, seed=3).update(status="failed")
    (row,) = [r for r in selectors.leaderboard_rows() if not r.is_reference]
    assert (row.summary.episodes, row.summary.failed) == (4, 1)
    assert viewer_client.get("/leaderboard/").status_code == 200


def test_held_out_seeds_avoid_every_seed_the_training_data_played():
    train = record_batch(policy="scripted", seeds=(0, 1, 3), steps=20)
    other = record_batch(policy="random", seeds=(2, 7), steps=20)
    # The episodes a dataset version would be built from: the filter of a saved dataset.
    filters = TurnSelection(batches=[train.id, other.id])
    episode_ids = set(turns_selected(filters).values_list("episode_id", flat=True))
    pairs = selectors.batch_seed_pairs(episode_ids=episode_ids)
    assert pairs == {(train.id, 0), (train.id, 1), (train.id, 3), (other.id, 2), (other.id, 7)}
    held_out = selectors.held_out_seeds_for(used=pairs, count=4)
    assert held_out == [4, 5, 6, 8]
    assert selectors.held_out_seeds_for(used=pairs, count=4) == held_out
    # A saved dataset version of the training batch only: seeds 0, 1, 3 are taken.
    dataset = Dataset.objects.create(name="train", filters={"batches": [train.id]})
    version = DatasetVersion.objects.create(
        dataset=dataset, number=1, filters={"batches": [train.id]}
    )
    used = selectors.dataset_version_seed_pairs(version=version)
    assert used == {(train.id, 0), (train.id, 1), (train.id, 3)}
    assert selectors.held_out_seeds_for(used=used, count=3) == [2, 4, 5]
    base = _finished_batch(seeds=[2, 4, 5, 6], model="base-vlm")
    plan = selectors.held_out_plan(version=version, count=3, base_model="base-vlm")
    assert plan.seeds == [2, 4, 5]
    assert [b.id for b in plan.base_batches] == [base.id]
    assert selectors.held_out_plan(version=version, count=4, base_model="base-vlm").seeds == [
        2,
        4,
        5,
        6,
    ]
    assert (
        selectors.held_out_plan(version=version, count=5, base_model="base-vlm").base_batches == []
    )


def test_it_finds_the_base_models_batches_on_the_held_out_seeds():
    covering = _finished_batch(seeds=[4, 5, 6, 8, 9], model="base")
    _finished_batch(seeds=[4, 5], model="base")  # misses 6 and 8
    _finished_batch(seeds=[4, 5, 6, 8], model="other")
    found = selectors.batches_covering_seeds(model="base", seeds=[4, 5, 6, 8])
    assert [b.id for b in found] == [covering.id]
    assert selectors.batches_covering_seeds(model="base", seeds=[]) == []


def test_the_leaderboard_is_cached_until_its_batches_episodes_change(
    django_assert_num_queries,
):
    batch = _finished_batch(seeds=range(4), unlocked=["collect_wood"])
    (first,) = [r for r in selectors.leaderboard_rows() if not r.is_reference]
    assert (first.summary.episodes, first.summary.failed) == (4, 0)
    # Finished batches and their episodes' signature; their episodes are not read again.
    with django_assert_num_queries(2):
        (again,) = [r for r in selectors.leaderboard_rows() if not r.is_reference]
    assert again.summary == first.summary
    Episode.objects.filter(batch=batch, seed=3).update(status="failed")
    (failed,) = [r for r in selectors.leaderboard_rows() if not r.is_reference]
    assert (failed.summary.episodes, failed.summary.failed) == (4, 1)
    Episode.objects.create(batch=batch, seed=9, status="finished", achievements={})
    (grown,) = [r for r in selectors.leaderboard_rows() if not r.is_reference]
    assert (grown.summary.episodes, grown.summary.finished) == (5, 4)
    # collect_wood in 3 of 4 finished episodes: 75%.
    assert grown.summary.success_rates["collect_wood"] == 75.0


def test_the_database_groups_episodes_as_a_summary_of_each_would(viewer_client):
    batch = RolloutBatch.objects.create(
        policy="openai", model="vlm-g", seeds=[0, 1, 2, 3, 4], status="finished", settings={}
    )
    rows = [
        # seed, status, achievements (as stored: hostile shapes too), reward, steps
        (0, "finished", {"collect_wood": 3, "place_table": 9}, 2.0, 100),
        (1, "finished", {"place_table": 1, "collect_wood": 2}, 4.0, 200),  # same names
        (2, "finished", ["collect_wood"], 0.0, 50),  # not an object: nothing unlocked
        (3, "finished", {"not_an_achievement": 1}, 1.0, 50),
        (4, "failed", {"collect_wood": 1}, 9.0, 10),
    ]
    Episode.objects.bulk_create(
        Episode(batch=batch, seed=seed, status=status, achievements=a, total_reward=r, steps=n)
        for seed, status, a, r, n in rows
    )
    (row,) = [r for r in selectors.leaderboard_rows() if not r.is_reference]
    summary = row.summary
    assert (summary.episodes, summary.finished, summary.failed) == (5, 4, 1)
    assert summary.success_rates["collect_wood"] == summary.success_rates["place_table"] == 50.0
    # Two achievements at 50%: e^(2 ln 51 / 22) - 1 = 0.42966%.
    assert summary.crafter_score == pytest.approx(0.429663, abs=1e-6)
    # Unique achievements 2, 2, 0, 0: mean 1, se sqrt((4 / 3) / 4) = 0.57735.
    assert (summary.mean_unique, summary.mean_unique_se) == pytest.approx((1.0, 0.577350))
    # Rewards 2, 4, 0, 1: mean 1.75, squares 8.75, se sqrt(8.75 / 3 / 4) = 0.853913.
    assert (summary.mean_reward, summary.mean_reward_se) == pytest.approx((1.75, 0.853913))
    # Steps 100, 200, 50, 50: mean 100, squares 15,000, se sqrt(5,000 / 4) = 35.3553.
    assert (summary.mean_steps, summary.mean_steps_se) == pytest.approx((100.0, 35.35534))
    # Episode by episode, the same summary to the last digit, bootstrap interval included.
    (outcomes,) = selectors.outcomes_by_batch(batch_ids=[batch.id]).values()
    one_by_one = summarize(outcomes)
    assert one_by_one.score_interval == pytest.approx(summary.score_interval, abs=1e-12)
    assert one_by_one.rate_intervals == summary.rate_intervals


def _fork_batch(*, of: Episode, turn: int, with_correction: bool, **kwargs) -> RolloutBatch:
    """A finished batch of one fork of `of` at `turn`, as `episode_fork` leaves its rows."""
    fork = _finished_batch(seeds=[of.seed], **kwargs)
    fork.episodes.update(
        forked_from=of,
        forked_at_turn=turn,
        fork_prefix_turns=turn + with_correction,
        fork_with_correction=with_correction,
    )
    return fork


def test_forks_and_human_games_are_not_pooled_into_a_models_row(viewer_client):
    own = _finished_batch(seeds=range(0, 4), model="fake-vlm")
    again = _finished_batch(seeds=range(4, 8), model="fake-vlm", unlocked=["collect_wood"])
    # A fork of one of its episodes at turn 4 with a person's correction: its opening turns
    # are a replay, one of them a person's action. And a game a person played.
    corrected = _fork_batch(
        of=own.episodes.get(seed=1),
        turn=4,
        with_correction=True,
        model="fake-vlm",
        unlocked=ACHIEVEMENTS[:6],
    )
    human = _finished_batch(seeds=[0], policy="human", unlocked=ACHIEVEMENTS[:9])
    # A fork whose original was deleted since: still a fork.
    orphan = _fork_batch(
        of=own.episodes.get(seed=2), turn=2, with_correction=False, model="fake-vlm"
    )
    Episode.objects.filter(batch=orphan).update(forked_from=None)

    (row,) = [r for r in selectors.leaderboard_rows() if not r.is_reference]
    assert (row.label, row.batch_ids, row.play) == ("fake-vlm", [own.id, again.id], "own")
    assert row.summary.episodes == 8 and row.summary.success_rates["collect_wood"] == 50.0

    shown = [r for r in selectors.leaderboard_rows(include_forks=True) if not r.is_reference]
    plays = {(r.label, r.play): r.batch_ids for r in shown}
    assert plays == {
        ("fake-vlm", "own"): [own.id, again.id],
        ("fake-vlm", "fork"): [corrected.id, orphan.id],
        ("human", "human"): [human.id],
    }
    assert [r.is_own_play for r in shown if r.batch_ids == [human.id]] == [False]


def test_the_page_hides_forks_until_asked_and_marks_them(viewer_client):
    own = _finished_batch(seeds=range(3), model="fake-vlm")
    fork = _fork_batch(
        of=own.episodes.get(seed=0),
        turn=4,
        with_correction=True,
        model="fake-vlm",
        unlocked=ACHIEVEMENTS[:8],
    )
    human = _finished_batch(seeds=[1], policy="human", unlocked=ACHIEVEMENTS[:2])

    response = viewer_client.get("/leaderboard/")
    html = response.content.decode()
    assert f'href="/rollouts/{own.id}/"' in html
    assert (
        f'href="/rollouts/{fork.id}/"' not in html and f'href="/rollouts/{human.id}/"' not in html
    )
    assert 'href="?include=forks"' in html and "2 rows of forks and people's games" in html
    assert [rank for rank, row in response.context["rows"] if not row.is_reference] == [1]

    response = viewer_client.get("/leaderboard/?include=forks")
    html = response.content.decode()
    for batch in (own, fork, human):
        assert f'href="/rollouts/{batch.id}/"' in html
    # The forks' and the person's rows are marked and unranked, whatever their score.
    ranked = {row.play: rank for rank, row in response.context["rows"] if not row.is_reference}
    assert ranked == {"own": 1, "fork": None, "human": None}
    assert html.count('class="not-own"') == 2
    assert 'data-play="fork"' in html and 'data-play="human"' in html
    assert 'id="play-toggle" href="/leaderboard/"' in html  # the way back


def test_a_row_lists_every_batch_it_pools(viewer_client):
    batches = [_finished_batch(seeds=[s], model="many") for s in range(9)]
    html = viewer_client.get("/leaderboard/").content.decode()
    for batch in batches:
        assert f'<a href="/rollouts/{batch.id}/">#{batch.id}</a>' in html
    assert "pools 9 batches" in html
