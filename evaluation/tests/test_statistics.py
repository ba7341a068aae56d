"""evaluation.statistics against numbers worked out by hand and the Crafter paper's."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from evaluation.selectors import REFERENCE_FILE
from evaluation.statistics import (
    EpisodeOutcome,
    bootstrap,
    held_out_seeds,
    mean_and_se,
    paired_comparison,
    summarize,
    wilson_interval,
)
from rollouts.game.crafter_env import ACHIEVEMENTS
from rollouts.game.scoring import crafter_score

# 101 ** (1/22) - 1, in percent: one achievement at 100%, the other 21 at 0%.
# ln 101 = 4.6151205; / 22 = 0.2097782; e^0.2097782 = 1.2334 -> 0.2334.
ONE_AT_100 = 0.2334
EVERYTHING = frozenset(ACHIEVEMENTS)


def outcome(seed: int, *unlocked: str, status: str = "finished", **kw) -> EpisodeOutcome:
    return EpisodeOutcome(seed=seed, status=status, achievements=frozenset(unlocked), **kw)


def test_it_computes_wilson_intervals_by_hand():
    # 5 of 10, z = 1.96: centre 0.5; half = 1.96 sqrt(.025 + .009604) / 1.38416 = 0.26341.
    low, high = wilson_interval(5, 10)
    assert low == pytest.approx(0.23659, abs=1e-5)
    assert high == pytest.approx(0.76341, abs=1e-5)
    # 0 of 10: centre = half = 0.19208 / 1.38416 = 0.13877 -> [0, 0.27754].
    low, high = wilson_interval(0, 10)
    assert low == 0.0
    assert high == pytest.approx(0.27754, abs=1e-5)
    # 10 of 10 mirrors it.
    assert wilson_interval(10, 10) == pytest.approx((1 - 0.27754, 1.0), abs=1e-5)
    # 1 of 1: centre (1 + 1.92074) / 4.84146 = 0.60326; half 1.96 * 0.97999 / 4.84146 = 0.39674.
    assert wilson_interval(1, 1) == pytest.approx((0.20652, 1.0), abs=1e-4)


def test_it_computes_means_with_standard_errors_by_hand():
    # 1, 2, 3, 4: mean 2.5; sample variance (2.25 + .25 + .25 + 2.25) / 3 = 5/3;
    # se = sqrt(5/3 / 4) = 0.645497.
    mean, se = mean_and_se([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5
    assert se == pytest.approx(0.645497, abs=1e-6)
    assert mean_and_se([]) == (0.0, 0.0)
    assert mean_and_se([7.0]) == (7.0, 0.0)


def test_it_gives_a_zero_width_bootstrap_interval_when_every_episode_is_the_same():
    summary = summarize([outcome(s, "collect_wood") for s in range(20)])
    assert summary.crafter_score == pytest.approx(ONE_AT_100, abs=1e-4)
    assert summary.score_interval == pytest.approx((ONE_AT_100, ONE_AT_100), abs=1e-4)


def test_it_bootstraps_two_episodes_to_their_extremes():
    # Resampling 2 episodes gives {none, none} (p 1/4, score 0), {none, all} (p 1/2, every
    # rate 50%, score 50) or {all, all} (p 1/4, score 100). The 2.5th and 97.5th
    # percentiles fall inside the outer quarters: the interval is [0, 100].
    summary = summarize([outcome(0), EpisodeOutcome(seed=1, status="finished",
                                                    achievements=EVERYTHING)])  # fmt: skip
    assert summary.crafter_score == pytest.approx(50.0)
    assert summary.score_interval == (0.0, pytest.approx(100.0))


@pytest.mark.parametrize("grouped", [True, False], ids=["a draw per group", "a draw per unit"])
def test_both_ways_of_drawing_resamples_give_the_binomial_interval(grouped):
    # 300 successes in 1,000: a resample's mean is Binomial(1000, 0.3) / 1000, whose 95%
    # interval is 0.3 +- 1.96 sqrt(0.3 * 0.7 / 1000) = 0.3 +- 0.0284 -> [0.2716, 0.3284].
    # Two groups of alike units, or the 1,000 units each on its own: the same bootstrap.
    values = np.array([1.0, 0.0]) if grouped else np.array([1.0] * 300 + [0.0] * 700)
    counts = np.array([300, 700]) if grouped else np.ones(1_000, dtype=int)
    means = bootstrap(counts, lambda weights: weights @ values / 1_000)
    assert len(means) == 1_000
    low, high = np.percentile(means, [2.5, 97.5])
    assert low == pytest.approx(0.2716, abs=0.004)
    assert high == pytest.approx(0.3284, abs=0.004)


def test_the_bootstrap_interval_is_the_same_for_the_same_data():
    episodes = [outcome(s, *ACHIEVEMENTS[: s % 5]) for s in range(40)]
    assert summarize(episodes).score_interval == summarize(list(reversed(episodes))).score_interval


def test_it_summarizes_progression_reward_and_steps_and_counts_failures():
    episodes = [
        outcome(0, *ACHIEVEMENTS[:11], reward=1.0, steps=100),
        outcome(1, reward=3.0, steps=300),
        outcome(2, "collect_wood", status="failed"),
        outcome(3, status="running"),
    ]
    summary = summarize(episodes)
    assert (summary.episodes, summary.finished, summary.failed, summary.unfinished) == (4, 2, 1, 1)
    # 11 and 0 of 22: mean 5.5 unique, progression 25%; se of (11, 0) = 5.5.
    assert summary.mean_unique == 5.5
    assert summary.progression == pytest.approx(25.0)
    assert summary.progression_se == pytest.approx(25.0)
    assert summary.mean_reward == 2.0 and summary.mean_reward_se == pytest.approx(1.0)
    assert summary.mean_steps == 200.0
    # The failed episode's collect_wood does not count: 1 of 2 finished has it.
    assert summary.success_rates["collect_wood"] == 50.0
    assert summary.rate_intervals["collect_wood"][0] > 0


def test_a_batch_compared_with_itself_differs_by_exactly_zero():
    episodes = [outcome(s, *ACHIEVEMENTS[: (s * 7) % 9]) for s in range(30)]
    comparison = paired_comparison(base=episodes, other=episodes)
    assert comparison.score == 0.0
    assert comparison.score_interval == (0.0, 0.0)
    assert set(comparison.success_rates.values()) == {0.0}
    assert comparison.wins == {"base": 0, "other": 0, "tie": 30}


def test_it_pairs_on_seeds_whatever_the_order():
    base = [outcome(1, "collect_wood"), outcome(2)]
    other = [outcome(2, "collect_wood", "place_table"), outcome(1)]
    comparison = paired_comparison(base=base, other=other)
    assert comparison.paired_seeds == [1, 2]
    by_seed = {r.seed: r.winner for r in comparison.per_seed}
    assert by_seed == {1: "base", 2: "other"}
    assert comparison.success_rates["collect_wood"] == 0.0
    assert comparison.success_rates["place_table"] == 50.0


def test_a_constant_improvement_has_a_zero_width_paired_interval():
    base = [outcome(s) for s in range(10)]
    other = [outcome(s, "collect_wood") for s in range(10)]
    comparison = paired_comparison(base=base, other=other)
    assert comparison.score == pytest.approx(ONE_AT_100, abs=1e-4)
    assert comparison.score_interval == pytest.approx((ONE_AT_100, ONE_AT_100), abs=1e-4)
    assert comparison.success_rates["collect_wood"] == 100.0


def test_failed_episodes_are_left_out_of_pairs_and_said_so():
    base = [outcome(1, "collect_wood"), outcome(2, status="failed"), outcome(3)]
    other = [outcome(1), outcome(2), outcome(3, status="failed")]
    comparison = paired_comparison(base=base, other=other)
    assert comparison.paired_seeds == [1]
    assert comparison.unpaired_seeds == {2: "base", 3: "other"}


def test_several_samples_of_a_seed_are_averaged_not_counted_twice():
    base = [outcome(1), outcome(2)]
    other = [outcome(1, "collect_wood"), outcome(1), outcome(2, "collect_wood")]
    comparison = paired_comparison(base=base, other=other)
    # Seed 1: 1 of 2 samples -> 0.5; seed 2: 1 -> mean over seeds 0.75 = 75%.
    assert comparison.success_rates["collect_wood"] == 75.0
    assert [r.other_unique for r in comparison.per_seed] == [0.5, 1.0]


def test_it_picks_the_smallest_unused_seeds():
    assert held_out_seeds(used={0, 1, 2, 5}, count=3) == [3, 4, 6]
    assert held_out_seeds(used=[], count=2, start=100) == [100, 101]
    assert held_out_seeds(used={3}, count=0) == []


def test_the_papers_success_rates_give_the_papers_score():
    reference = json.loads(REFERENCE_FILE.read_text())
    for agent in ("random", "human_experts"):
        data = reference["agents"][agent]
        assert set(data["success_rates"]) == set(ACHIEVEMENTS)
        score = crafter_score(data["success_rates"])
        assert math.isclose(score, data["score_of_mean_rates"], abs_tol=0.005), agent


def test_the_repositorys_reference_file_is_the_shared_one():
    shared = Path(__file__).resolve().parents[3] / "shared/reference/crafter_reference_scores.json"
    if not shared.exists():
        pytest.skip("no shared/ beside the checkout")
    assert json.loads(shared.read_text()) == json.loads(REFERENCE_FILE.read_text())
