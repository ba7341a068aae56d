"""Best-of-N groups as the dataset page shows them: what each group of samples keeps.

Which episodes a group keeps is part of the turn selection (`rollouts.review.turn_selection`:
`top_per_seed`, `at_or_above_mean`); this module tabulates it for the live counts and preview.
"""

from __future__ import annotations

from typing import Any

from rollouts.review.turn_selection import TurnSelection, kept_episodes, ranked_episodes


def kept_episode_ids(filters: TurnSelection) -> list[int]:
    return list(kept_episodes(filters).values_list("id", flat=True))


def group_table(filters: TurnSelection, *, limit: int = 12) -> dict[str, Any]:
    """What each group keeps, for the live counts and the preview: the first `limit` groups."""
    kept = set(kept_episode_ids(filters))
    groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
    total_groups = 0
    rows = ranked_episodes(filters).order_by("batch_id", "seed", "group_rank")
    for episode in rows.values(
        "id", "batch_id", "seed", "sample", "achievement_count", "total_reward", "group_rank",
        "group_mean",
    ):  # fmt: skip
        key = (episode["batch_id"], episode["seed"])
        if key not in groups:
            total_groups += 1
            if len(groups) >= limit:
                continue
            groups[key] = []
        episode["kept"] = episode["id"] in kept
        groups[key].append(episode)
    return {
        "groups": [
            {
                "batch_id": key[0],
                "seed": key[1],
                "mean_reward": members[0]["group_mean"],
                "episodes": members,
                "kept": sum(1 for e in members if e["kept"]),
            }
            for key, members in groups.items()
        ],
        "total_groups": total_groups,
        "kept_episodes": len(kept),
        "shown": min(limit, total_groups),
    }
