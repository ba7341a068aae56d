"""Statistics of played episodes: intervals, bootstrap, paired comparison on shared seeds.

Pure and Django-free. The Crafter score itself comes from `rollouts.game.scoring` (its one
place); this module only feeds it resampled success rates.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from rollouts.game.crafter_env import ACHIEVEMENTS
from rollouts.game.scoring import crafter_score, crafter_scores

# 97.5th percentile of the standard normal: two-sided 95% intervals.
Z95 = 1.959963984540054
BOOTSTRAP_RESAMPLES = 1000
# Fixed, so the same episodes always give the same interval (pages, CSV and CLI agree).
BOOTSTRAP_SEED = 2109_06780
# Resample rows built at once: bounds memory at ~16 MB whatever the number of episodes.
_CHUNK_CELLS = 2_000_000
# A binomial draw costs about as much as this many uniform integer draws and their count
# (measured with numpy's default generator): which way `bootstrap` draws its weights.
_DRAWS_PER_BINOMIAL = 20
FINISHED = "finished"
FAILED = "failed"

Interval = tuple[float, float]


@dataclass(frozen=True)
class EpisodeOutcome:
    """What an evaluation needs of one episode. Only finished episodes enter the statistics;
    the others are counted (failed, or not over yet), never silently left out."""

    seed: int
    status: str
    achievements: frozenset[str] = frozenset()
    reward: float = 0.0
    steps: int = 0
    episode_id: int | None = None

    @property
    def finished(self) -> bool:
        return self.status == FINISHED


@dataclass(frozen=True)
class Summary:
    episodes: int
    finished: int
    failed: int
    unfinished: int  # pending or running
    success_rates: dict[str, float]  # percent
    rate_intervals: dict[str, Interval]  # Wilson 95%, percent
    crafter_score: float
    score_interval: Interval  # bootstrap 95% over episodes
    mean_unique: float
    mean_unique_se: float
    progression: float  # BALROG: percent of the 22 achievements, mean over episodes
    progression_se: float
    mean_reward: float
    mean_reward_se: float
    mean_steps: float
    mean_steps_se: float


@dataclass(frozen=True)
class SeedResult:
    seed: int
    base_unique: float  # mean over the seed's samples
    other_unique: float
    winner: str  # "base", "other" or "tie"


@dataclass(frozen=True)
class PairedComparison:
    """`other` minus `base` on the seeds where both have a finished episode."""

    paired_seeds: list[int]
    # seed -> which side(s) had no finished episode on it ("base", "other" or "both")
    unpaired_seeds: dict[int, str]
    score: float
    score_interval: Interval
    success_rates: dict[str, float]  # percentage points
    rate_intervals: dict[str, Interval]
    per_seed: list[SeedResult] = field(default_factory=list)

    @cached_property
    def wins(self) -> dict[str, int]:
        """On how many seeds each side unlocked more (or as many: "tie")."""
        counts = {"base": 0, "other": 0, "tie": 0}
        for result in self.per_seed:
            counts[result.winner] += 1
        return counts


def wilson_interval(successes: int, trials: int, *, z: float = Z95) -> Interval:
    """Wilson score interval of a binomial proportion, as fractions in [0, 1].

    Unlike the normal approximation it stays inside [0, 1] and is not zero-width at 0 or n
    successes, which is the common case for the hard achievements.
    """
    if trials <= 0:
        return (0.0, 1.0)
    if not 0 <= successes <= trials:
        raise ValueError(f"successes {successes} not within 0..{trials}")
    p = successes / trials
    z2 = z * z
    denominator = 1 + z2 / trials
    center = (p + z2 / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / denominator
    return (max(0.0, center - half), min(1.0, center + half))


def mean_and_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error (sample standard deviation / sqrt(n))."""
    return Moments.of(values).mean_and_se()


def unlocked_matrix(achievement_sets: Iterable[Iterable[str]]) -> np.ndarray:
    """Rows of 0/1 per achievement, in crafter's order."""
    index = {name: i for i, name in enumerate(ACHIEVEMENTS)}
    rows, columns = [], []
    count = 0
    for row, unlocked in enumerate(achievement_sets):
        count += 1
        for name in unlocked:
            if name in index:
                rows.append(row)
                columns.append(index[name])
    matrix = np.zeros((count, len(ACHIEVEMENTS)))
    matrix[rows, columns] = 1.0
    return matrix


def _score_of_rows(rates: np.ndarray) -> np.ndarray:
    """The Crafter score of each row of percent rates, through the one formula."""
    return crafter_scores(rates)


def bootstrap(
    counts: np.ndarray,
    statistic: Callable[[np.ndarray], np.ndarray],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> np.ndarray:
    """`statistic` of `resamples` resamples (with replacement) of `counts.sum()` units.

    Units that are alike (the same unlocked achievements, say) come as one group each:
    `counts[k]` is how many units group k holds. `statistic` gets a (rows, groups) matrix of
    weights, how many units of each group were drawn in each resample, and returns one value
    per row: a statistic of means is a matrix product, not a Python loop over episodes.

    Drawing n units uniformly puts Multinomial(n, counts / n) units in the groups, so with few
    groups (40,000 episodes of a dozen kinds) the weights are drawn as that: a draw per group,
    not per unit. With many, the units are drawn one by one; both are the same bootstrap.
    """
    counts = np.asarray(counts, dtype=np.int64)
    units, groups = int(counts.sum()), len(counts)
    rng = np.random.default_rng(seed)
    by_group = groups * _DRAWS_PER_BINOMIAL < units
    chunk = max(1, _CHUNK_CELLS // max(groups if by_group else units, 1))
    group_of_unit = None if by_group else np.repeat(np.arange(groups), counts)
    values = []
    done = 0
    while done < resamples:
        rows = min(chunk, resamples - done)
        if by_group:
            weights = rng.multinomial(units, counts / units, size=rows)
        else:
            draws = group_of_unit[rng.integers(0, units, size=(rows, units))]
            offsets = (np.arange(rows) * groups)[:, None]
            weights = np.bincount((draws + offsets).ravel(), minlength=rows * groups)
        values.append(statistic(weights.reshape(rows, groups).astype(np.float64)))
        done += rows
    return np.concatenate(values)


def alike_rows(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of `matrix` (in the order of their bytes) and how often each occurs."""
    patterns, inverse = _distinct_rows(matrix)
    return patterns, np.bincount(inverse, minlength=len(patterns))


def _distinct_rows(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of `matrix` in the order of their bytes, and each row's place there."""
    matrix = np.ascontiguousarray(matrix, dtype=np.float64)
    if not len(matrix):
        return matrix, np.zeros(0, dtype=np.int64)
    # Each row as one opaque value: numpy's unique over rows (axis=0) is ten times slower.
    rows = matrix.view(np.dtype((np.void, matrix.shape[1] * matrix.itemsize))).ravel()
    _, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
    return matrix[first], inverse.ravel()


def percentile_interval(values: np.ndarray) -> Interval:
    low, high = np.percentile(values, [2.5, 97.5])
    return (float(low), float(high))


@dataclass(frozen=True)
class Moments:
    """Count, mean and sum of squared deviations of some values: what a mean and its
    standard error need, and what two sets of values combine into (Chan et al.)."""

    count: int = 0
    mean: float = 0.0
    squares: float = 0.0  # sum of (value - mean) ** 2

    @classmethod
    def of(cls, values: Sequence[float]) -> Moments:
        if not values:
            return cls()
        mean = math.fsum(values) / len(values)
        return cls(len(values), mean, math.fsum((v - mean) ** 2 for v in values))

    def __add__(self, other: Moments) -> Moments:
        if not other.count:
            return self
        if not self.count:
            return other
        count = self.count + other.count
        delta = other.mean - self.mean
        return Moments(
            count,
            self.mean + delta * other.count / count,
            self.squares + other.squares + delta * delta * self.count * other.count / count,
        )

    def mean_and_se(self) -> tuple[float, float]:
        if self.count < 2:
            return (self.mean, 0.0)
        return (self.mean, math.sqrt(max(self.squares, 0.0) / (self.count - 1) / self.count))


@dataclass(frozen=True)
class OutcomeGroup:
    """Episodes alike in what a summary reads of them (their status and achievements), with
    the moments of their rewards and steps: a summary of 40,000 episodes of a dozen kinds is
    a dozen groups (read grouped by the database, see `evaluation.selectors`)."""

    status: str
    achievements: frozenset[str]
    rewards: Moments
    steps: Moments

    @property
    def episodes(self) -> int:
        return self.rewards.count


def outcome_groups(outcomes: Iterable[EpisodeOutcome]) -> list[OutcomeGroup]:
    by_kind: dict[tuple[str, frozenset[str]], list[EpisodeOutcome]] = defaultdict(list)
    for o in outcomes:
        by_kind[(o.status, o.achievements)].append(o)
    return [
        OutcomeGroup(
            status=status,
            achievements=achievements,
            rewards=Moments.of([o.reward for o in alike]),
            steps=Moments.of([float(o.steps) for o in alike]),
        )
        for (status, achievements), alike in by_kind.items()
    ]


def summarize(outcomes: Iterable[EpisodeOutcome]) -> Summary:
    """One set of episodes: rates with Wilson intervals, score with a bootstrap interval."""
    return summarize_groups(outcome_groups(outcomes))


def summarize_groups(groups: Iterable[OutcomeGroup]) -> Summary:
    """`summarize` of the episodes the groups hold (in any order: the same summary)."""
    groups = list(groups)
    finished = [g for g in groups if g.status == FINISHED]
    episodes = sum(g.episodes for g in groups)
    failed = sum(g.episodes for g in groups if g.status == FAILED)
    sizes = np.array([g.episodes for g in finished], dtype=np.int64)
    n = int(sizes.sum())
    matrix = unlocked_matrix(g.achievements for g in finished)
    counts = sizes @ matrix if n else np.zeros(len(ACHIEVEMENTS))
    rates = {
        name: 100.0 * float(c) / n if n else 0.0
        for name, c in zip(ACHIEVEMENTS, counts, strict=True)
    }
    intervals = {}
    for i, name in enumerate(ACHIEVEMENTS):
        low, high = wilson_interval(int(counts[i]), n) if n else (0.0, 0.0)
        intervals[name] = (100 * low, 100 * high)
    score = crafter_score(rates)
    if n:
        # Groups that differ only in names crafter does not have are alike to the score.
        patterns, inverse = _distinct_rows(matrix)
        weights = np.bincount(inverse, weights=sizes, minlength=len(patterns)).astype(np.int64)
        resampled = bootstrap(weights, lambda w: _score_of_rows(100 * (w @ patterns) / n))
        score_interval = percentile_interval(resampled)
    else:
        score_interval = (0.0, 0.0)
    unique = sum(
        (
            Moments(g.episodes, float(row.sum()), 0.0)
            for g, row in zip(finished, matrix, strict=True)
        ),
        Moments(),
    )
    mean_unique, unique_se = unique.mean_and_se()
    reward, reward_se = sum((g.rewards for g in finished), Moments()).mean_and_se()
    steps, steps_se = sum((g.steps for g in finished), Moments()).mean_and_se()
    share = 100 / len(ACHIEVEMENTS)
    return Summary(
        episodes=episodes,
        finished=n,
        failed=failed,
        unfinished=episodes - n - failed,
        success_rates=rates,
        rate_intervals=intervals,
        crafter_score=score,
        score_interval=score_interval,
        mean_unique=mean_unique,
        mean_unique_se=unique_se,
        progression=mean_unique * share,
        progression_se=unique_se * share,
        mean_reward=reward,
        mean_reward_se=reward_se,
        mean_steps=steps,
        mean_steps_se=steps_se,
    )


def _per_seed(outcomes: Iterable[EpisodeOutcome]) -> dict[int, np.ndarray]:
    """Seed -> mean 0/1 row over the seed's finished episodes.

    A seed may hold several samples (episodes of the same world); pairing is by seed, so a
    seed counts once and its samples are averaged: an achievement unlocked in 2 of 4 samples
    counts as 0.5 for that seed. With one sample per seed this is the plain 0/1 row.
    """
    finished = [o for o in outcomes if o.finished]
    if not finished:
        return {}
    matrix = unlocked_matrix(o.achievements for o in finished)
    seeds, index = np.unique([o.seed for o in finished], return_inverse=True)
    sums = np.zeros((len(seeds), matrix.shape[1]))
    np.add.at(sums, index, matrix)
    means = sums / np.bincount(index)[:, None]
    return {int(seed): means[i] for i, seed in enumerate(seeds)}


def paired_comparison(
    *, base: Iterable[EpisodeOutcome], other: Iterable[EpisodeOutcome]
) -> PairedComparison:
    """`other` against `base` on the same worlds, resampling seeds (a paired bootstrap).

    Seeds that only one side played are not this function's business (the caller picks the
    shared seeds); seeds both played where a side has no finished episode are returned in
    `unpaired_seeds`, so a page can say which were left out and why.
    """
    base, other = list(base), list(other)
    base_rows, other_rows = _per_seed(base), _per_seed(other)
    played = {o.seed for o in base} | {o.seed for o in other}
    seeds = sorted(set(base_rows) & set(other_rows))
    unpaired = {}
    for seed in sorted(played - set(seeds)):
        sides = (("base", base_rows), ("other", other_rows))
        missing = [side for side, rows in sides if seed not in rows]
        unpaired[seed] = "both" if len(missing) == 2 else missing[0]
    n = len(seeds)
    names = list(ACHIEVEMENTS)
    if not n:
        zero = dict.fromkeys(names, 0.0)
        return PairedComparison(
            paired_seeds=[],
            unpaired_seeds=unpaired,
            score=0.0,
            score_interval=(0.0, 0.0),
            success_rates=zero,
            rate_intervals=dict.fromkeys(names, (0.0, 0.0)),
        )
    a = np.array([base_rows[s] for s in seeds])
    b = np.array([other_rows[s] for s in seeds])
    rates_a = 100 * a.mean(axis=0)
    rates_b = 100 * b.mean(axis=0)
    score = crafter_score(dict(zip(names, rates_b, strict=True))) - crafter_score(
        dict(zip(names, rates_a, strict=True))
    )
    rate_draws: list[np.ndarray] = []
    # Seeds alike on both sides resample as one group.
    pairs, counts = alike_rows(np.hstack([a, b]))
    group_a, group_b = pairs[:, : a.shape[1]], pairs[:, a.shape[1] :]

    def score_difference(weights: np.ndarray) -> np.ndarray:
        # The same resampled seeds on both sides: that is what makes the bootstrap paired.
        resampled_a = 100 * (weights @ group_a) / n
        resampled_b = 100 * (weights @ group_b) / n
        rate_draws.append(resampled_b - resampled_a)
        return _score_of_rows(resampled_b) - _score_of_rows(resampled_a)

    score_draws = bootstrap(counts, score_difference)
    rate_matrix = np.concatenate(rate_draws)
    rate_low, rate_high = np.percentile(rate_matrix, [2.5, 97.5], axis=0)
    base_unique = a.sum(axis=1)
    other_unique = b.sum(axis=1)
    per_seed = [
        SeedResult(
            seed=seed,
            base_unique=float(x),
            other_unique=float(y),
            winner="other" if y > x else "base" if x > y else "tie",
        )
        for seed, x, y in zip(seeds, base_unique, other_unique, strict=True)
    ]
    return PairedComparison(
        paired_seeds=seeds,
        unpaired_seeds=unpaired,
        score=float(score),
        score_interval=percentile_interval(score_draws),
        success_rates={name: float(d) for name, d in zip(names, rates_b - rates_a, strict=True)},
        rate_intervals={
            name: (float(lo), float(hi))
            for name, lo, hi in zip(names, rate_low, rate_high, strict=True)
        },
        per_seed=per_seed,
    )


def held_out_seeds(*, used: Iterable[int], count: int, start: int = 0) -> list[int]:
    """The `count` smallest seeds >= `start` that are not in `used`.

    Deterministic, and the smallest seeds rather than a random draw: two fine-tunes of the
    same data get the same held-out worlds, so one evaluation of the base model on them
    serves every comparison.
    """
    if count < 0:
        raise ValueError("count must be 0 or more")
    taken = set(used)
    seeds: list[int] = []
    seed = start
    while len(seeds) < count:
        if seed not in taken:
            seeds.append(seed)
        seed += 1
    return seeds
