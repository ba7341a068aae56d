"""Reads for the play page and the fork links of the episode viewer."""

from __future__ import annotations

from typing import Any

from rollouts.models import Episode, Frame, Turn, TurnRelabel


def play_state(*, episode: Episode) -> dict[str, Any]:
    """What the play page shows: the last frame, its state, the turns played."""
    frame = Frame.objects.filter(episode_id=episode.id).order_by("-step").first()
    turns = Turn.objects.filter(episode_id=episode.id).count()
    return play_state_of(episode=episode, frame=frame, turns=turns)


def play_state_of(*, episode: Episode, frame: Frame | None, turns: int) -> dict[str, Any]:
    """The same, from what a key press already holds (no query)."""
    return {
        "episode": episode.id,
        "status": episode.status,
        "turns": turns,
        "step": frame.step if frame else 0,
        "step_limit": episode.batch.step_limit,
        "frame": frame.sha256 if frame else "",
        "state": frame.state if frame else {},
        "total_reward": round(float(episode.total_reward), 4),
        "achievements": sorted(episode.achievements),
    }


def relabel_json(relabel: TurnRelabel) -> dict[str, Any]:
    user = relabel.labeled_by
    return {
        "actions": list(relabel.actions),
        "reason": relabel.reason,
        "by": user.get_username() if user else "",
        "at": relabel.labeled_at.isoformat(timespec="seconds"),
    }


def episode_forks(*, episode_id: int) -> list[dict[str, Any]]:
    """The forks made of an episode, newest first: where each left it and how it went."""
    return list(
        Episode.objects.filter(forked_from_id=episode_id)
        .order_by("-id")
        .values("id", "forked_at_turn", "fork_with_correction", "status", "batch__policy")
    )


def unlocks_by_turn(*, turns: list[dict[str, Any]]) -> list[tuple[str, int, int]]:
    """(achievement, position in the viewer, turn index) in the order they were unlocked.

    Named after the turn whose actions unlocked it, not the step after it (turn 9 unlocks
    at step 10): the chip links to the turn a reviewer wants to see.
    """
    found: list[tuple[str, int, int]] = []
    seen: set[str] = set()
    for position, turn in enumerate(turns):
        for name in turn["unlocked"]:
            if name not in seen:
                seen.add(name)
                found.append((name, position, turn["index"]))
    return found
