"""The Crafter score (Hafner 2021): the one place it is computed."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from rollouts.game.crafter_env import ACHIEVEMENTS


def success_rates(episode_achievements: Iterable[Iterable[str]]) -> dict[str, float]:
    """Percent of episodes that unlocked each achievement at least once."""
    counts = dict.fromkeys(ACHIEVEMENTS, 0)
    episodes = 0
    for unlocked in episode_achievements:
        episodes += 1
        for name in set(unlocked):
            if name in counts:
                counts[name] += 1
    if not episodes:
        return dict.fromkeys(ACHIEVEMENTS, 0.0)
    return {name: 100.0 * n / episodes for name, n in counts.items()}


def crafter_score(rates: Mapping[str, float]) -> float:
    """exp(mean(ln(1 + s_i))) - 1 over the 22 achievements' success rates in percent."""
    return float(crafter_scores(np.array([rates.get(name, 0.0) for name in ACHIEVEMENTS])))


def crafter_scores(rates: np.ndarray) -> np.ndarray:
    """The score of each row of success rates in percent, in crafter's achievement order.

    The formula itself; a bootstrap scores a thousand resamples in one call.
    """
    return np.expm1(np.log1p(rates).mean(axis=-1))


# The one unit of the score everywhere (pages, command output, JSON): percent, two decimals,
# as the paper reports it. 0.23 means 0.23%, not 23%.
SCORE_UNIT = "percent (0-100, two decimals, as in Hafner 2021: 0.23 means 0.23%)"


def score_percent(score: float) -> float:
    """The score as every output states it."""
    return round(score, 2)


def score_text(score: float | None) -> str:
    """`0.23%`, or `—` when no episode finished (there is no score yet)."""
    return "—" if score is None else f"{score_percent(score):.2f}%"
