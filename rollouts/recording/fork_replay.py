"""A fork's replay: what a fork episode replays of its original (its executed actions up
to the fork turn, each frame's sha256), read from the original's stored turns and frames."""

from __future__ import annotations

from rollouts.models import Episode, Frame, Turn, TurnRelabel
from rollouts.recording.recorder import (
    FORK_COPIED_FIELDS,
    ForkPrefix,
)


class ForkError(ValueError):
    """The fork cannot be made or failed its replay; the message says why, in one line."""


def fork_prefix(*, source: Episode, turn: int, with_correction: bool) -> ForkPrefix:
    """What the fork replays; raises ForkError when the turn cannot be forked from."""
    count = Turn.objects.filter(episode_id=source.id).count()
    if not 0 <= turn < count:
        raise ForkError(
            f"turn: episode {source.id} has turns 0 to {count - 1}; there is no turn {turn}"
            if count
            else f"turn: episode {source.id} has no turns to fork from"
        )
    fork_step = Frame.objects.filter(turns__episode_id=source.id, turns__index=turn).values_list(
        "step", flat=True
    )[0]
    correction = None
    if with_correction:
        relabel = TurnRelabel.objects.filter(turn__episode_id=source.id, turn__index=turn).first()
        if relabel is None:
            raise ForkError(f"turn {turn} of episode {source.id} has no correction to fork with")
        correction = tuple(relabel.actions)
    turns = list(
        Turn.objects.filter(episode_id=source.id, index__lt=turn)
        .order_by("index")
        .values("actions", *FORK_COPIED_FIELDS)
    )
    frames = dict(
        Frame.objects.filter(episode_id=source.id, step__lte=fork_step).values_list(
            "step", "sha256"
        )
    )
    return ForkPrefix(
        source_episode_id=source.id,
        turns=turns,
        frame_sha256=frames,
        fork_step=fork_step,
        correction=correction,
    )


def fork_prefix_of(*, episode: Episode) -> ForkPrefix | None:
    """The prefix a fork episode replays (None for an episode that is not a fork)."""
    if episode.forked_at_turn is None:
        return None
    if episode.forked_from_id is None:
        raise ForkError("the episode this fork replays has been deleted")
    source = Episode.objects.get(id=episode.forked_from_id)
    return fork_prefix(
        source=source, turn=episode.forked_at_turn, with_correction=episode.fork_with_correction
    )
