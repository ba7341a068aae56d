"""A comparison as JSON, CSV and a text table: what the command prints and the page downloads.

One function makes the JSON object (`compare_batches --json`, `docs/evaluation.md`); the CSV and
the table are built from it, so the three can never disagree.
"""

from __future__ import annotations

import csv
import io
from typing import Any

from evaluation.selectors import BatchComparison
from rollouts.game.crafter_env import ACHIEVEMENTS
from rollouts.game.scoring import score_percent

# Two decimals, as every output of the studio states percentages (rollouts.game.scoring).
DIGITS = 2


def _r(value: float) -> float:
    return round(float(value), DIGITS)


def _pair(interval: tuple[float, float]) -> list[float]:
    return [_r(interval[0]), _r(interval[1])]


def _score_pair(interval: tuple[float, float]) -> list[float]:
    return [score_percent(interval[0]), score_percent(interval[1])]


def comparison_json(comparison: BatchComparison) -> dict[str, Any]:
    """Percentages are 0-100 (success rates, Crafter score, progression); differences are
    percentage points, the other batch minus the first."""
    batches = []
    for column in comparison.columns:
        s = column.summary
        batches.append(
            {
                "id": column.batch.id,
                "name": column.batch.name,
                "policy": column.batch.policy,
                "model": column.batch.model,
                "episodes": s.episodes,
                "finished": s.finished,
                "failed": s.failed,
                "unfinished": s.unfinished,
                "crafter_score": score_percent(s.crafter_score),
                "score_interval": _score_pair(s.score_interval),
                "progression": _r(s.progression),
                "progression_se": _r(s.progression_se),
                "mean_unique_achievements": _r(s.mean_unique),
                "mean_unique_achievements_se": _r(s.mean_unique_se),
                "mean_reward": _r(s.mean_reward),
                "mean_reward_se": _r(s.mean_reward_se),
                "mean_steps": _r(s.mean_steps),
                "mean_steps_se": _r(s.mean_steps_se),
                "success_rates": {a: _r(s.success_rates[a]) for a in ACHIEVEMENTS},
                "success_rate_intervals": {a: _pair(s.rate_intervals[a]) for a in ACHIEVEMENTS},
                "left_out_seeds": column.left_out_seeds,
            }
        )
    differences = []
    for difference in comparison.differences:
        p = difference.paired
        differences.append(
            {
                "id": difference.batch.id,
                "against": difference.against.id,
                "paired_seeds": len(p.paired_seeds),
                "unpaired_seeds": [
                    {"seed": seed, "no_finished_episode_in": side}
                    for seed, side in p.unpaired_seeds.items()
                ],
                "score": score_percent(p.score),
                "score_interval": _score_pair(p.score_interval),
                "success_rates": {a: _r(p.success_rates[a]) for a in ACHIEVEMENTS},
                "success_rate_intervals": {a: _pair(p.rate_intervals[a]) for a in ACHIEVEMENTS},
                "seeds_won": p.wins,
                "per_seed": [
                    {
                        "seed": r.seed,
                        "first_unique": _r(r.base_unique),
                        "other_unique": _r(r.other_unique),
                        "more": {"base": "first", "other": "other", "tie": "tie"}[r.winner],
                    }
                    for r in p.per_seed
                ],
            }
        )
    return {
        "shared_seeds": comparison.shared_seeds,
        "batches": batches,
        "differences": differences,
    }


def comparison_csv(data: dict[str, Any]) -> str:
    """Long format, one value per line: easy to pivot in a spreadsheet or pandas."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["kind", "batch", "against", "metric", "value", "low", "high"])
    for b in data["batches"]:
        for metric in ("episodes", "finished", "failed", "unfinished"):
            writer.writerow(["batch", b["id"], "", metric, b[metric], "", ""])
        writer.writerow(["batch", b["id"], "", "crafter_score", b["crafter_score"],
                         *b["score_interval"]])  # fmt: skip
        for metric in ("progression", "mean_unique_achievements", "mean_reward", "mean_steps"):
            value, se = b[metric], b[f"{metric}_se"]
            writer.writerow(["batch", b["id"], "", metric, value, _r(value - 1.96 * se),
                             _r(value + 1.96 * se)])  # fmt: skip
        for a in ACHIEVEMENTS:
            writer.writerow(["batch", b["id"], "", f"success_rate:{a}", b["success_rates"][a],
                             *b["success_rate_intervals"][a]])  # fmt: skip
    for d in data["differences"]:
        writer.writerow(["difference", d["id"], d["against"], "paired_seeds",
                         d["paired_seeds"], "", ""])  # fmt: skip
        writer.writerow(["difference", d["id"], d["against"], "crafter_score", d["score"],
                         *d["score_interval"]])  # fmt: skip
        for a in ACHIEVEMENTS:
            writer.writerow(["difference", d["id"], d["against"], f"success_rate:{a}",
                             d["success_rates"][a], *d["success_rate_intervals"][a]])  # fmt: skip
    return out.getvalue()


def comparison_table(data: dict[str, Any]) -> list[str]:
    """The terminal view: one column per batch, then one per difference."""
    batches, differences = data["batches"], data["differences"]
    width = max(len(a) for a in ACHIEVEMENTS) + 2
    seeds = data["shared_seeds"]
    lines = [f"{len(seeds)} shared seeds"]
    for b in batches:
        left = len(b["left_out_seeds"])
        lines.append(
            f"batch {b['id']} ({b['policy']}{' ' + b['model'] if b['model'] else ''}): "
            f"{b['finished']} finished, {b['failed']} failed of {b['episodes']} on shared seeds"
            + (f"; {left} seeds left out (not in every batch)" if left else "")
        )
    header = "".join(f"{'#' + str(b['id']):>12}" for b in batches)
    header += "".join(f"{str(d['id']) + '-' + str(d['against']):>25}" for d in differences)
    lines.append(f"{'':<{width}}{header}")

    def diff_cell(value: float, interval: list[float]) -> str:
        return " " + f"{value:+.2f} [{interval[0]:+.1f},{interval[1]:+.1f}]".rjust(24)

    for a in ACHIEVEMENTS:
        row = "".join(f"{b['success_rates'][a]:>11.1f}%" for b in batches)
        row += "".join(
            diff_cell(d["success_rates"][a], d["success_rate_intervals"][a]) for d in differences
        )
        lines.append(f"{a:<{width}}{row}")
    row = "".join(f"{b['crafter_score']:>11.2f}%" for b in batches)
    row += "".join(diff_cell(d["score"], d["score_interval"]) for d in differences)
    lines.append(f"{'Crafter score':<{width}}{row}")
    intervals = (f"[{low:.2f},{high:.2f}]" for low, high in (b["score_interval"] for b in batches))
    row = "".join(f"{text:>12}" for text in intervals)
    lines.append(f"{'  95% interval':<{width}}{row}")
    lines.append(
        f"{'Progression':<{width}}" + "".join(f"{b['progression']:>11.2f}%" for b in batches)
    )
    for d in differences:
        won = d["seeds_won"]
        lines.append(
            f"batch {d['id']} vs {d['against']} on {d['paired_seeds']} paired seeds: unlocked "
            f"more on {won['other']}, fewer on {won['base']}, as many on {won['tie']}"
            + (
                f"; {len(d['unpaired_seeds'])} shared seeds left out (no finished episode)"
                if d["unpaired_seeds"]
                else ""
            )
        )
    return lines
