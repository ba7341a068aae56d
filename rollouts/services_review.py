"""Writes made by reviewers: flags and notes on turns, one at a time or in bulk."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet
from django.utils import timezone

from rollouts.crafter_env import ACTION_INDEX
from rollouts.models import Turn, TurnRelabel

NOTE_MAX_LENGTH = 10_000


def turn_flag(*, turn: Turn, flagged: bool, user: AbstractBaseUser) -> Turn:
    """Set (not toggle) the flag, so that a request sent twice leaves the same state."""
    turn.flagged = flagged
    turn.reviewed_by = user
    turn.reviewed_at = timezone.now()
    turn.save(update_fields=["flagged", "reviewed_by", "reviewed_at"])
    return turn


def turn_note(*, turn: Turn, note: str, user: AbstractBaseUser) -> Turn:
    text = note.replace("\r\n", "\n").strip()
    if len(text) > NOTE_MAX_LENGTH:
        raise ValueError(f"note: longer than {NOTE_MAX_LENGTH} characters")
    turn.note = text
    turn.reviewed_by = user
    turn.reviewed_at = timezone.now()
    turn.save(update_fields=["note", "reviewed_by", "reviewed_at"])
    return turn


def turns_bulk_flag(*, turns: QuerySet[Turn], flagged: bool, user: AbstractBaseUser) -> int:
    """Flag or unflag every turn of `turns` (all matches, not a page); returns how many changed.

    One UPDATE: turns already in the wanted state keep their reviewer and time.
    """
    return (
        turns.exclude(flagged=flagged)
        .order_by()
        .update(flagged=flagged, reviewed_by=user, reviewed_at=timezone.now())
    )


RELABEL_MAX_ACTIONS = 8
RELABEL_REASON_MAX_LENGTH = 2_000


def turn_relabel(
    *, turn: Turn, actions: list[str], reason: str, user: AbstractBaseUser
) -> TurnRelabel:
    """Set (or change) the actions the turn should have taken; the turn itself is untouched."""
    if not 1 <= len(actions) <= RELABEL_MAX_ACTIONS:
        raise ValueError(f"actions: pick 1 to {RELABEL_MAX_ACTIONS} actions")
    unknown = [a for a in actions if a not in ACTION_INDEX]
    if unknown:
        raise ValueError(f"actions: {unknown[0]!r} is not one of crafter's 17 actions")
    text = clean_text(reason)
    if len(text) > RELABEL_REASON_MAX_LENGTH:
        raise ValueError(f"reason: longer than {RELABEL_REASON_MAX_LENGTH} characters")
    relabel, _ = TurnRelabel.objects.update_or_create(
        turn=turn,
        defaults={
            "actions": list(actions),
            "reason": text,
            "labeled_by": user,
            "labeled_at": timezone.now(),
        },
    )
    return relabel


def turn_relabel_remove(*, turn: Turn) -> bool:
    """Drop the correction; the turn exports as the model answered it again."""
    deleted, _ = TurnRelabel.objects.filter(turn=turn).delete()
    return deleted > 0


def clean_text(text: str) -> str:
    """A person's free text as stored: no NUL bytes or lone surrogates, Unix line ends."""
    text = text.replace("\x00", "").replace("\r\n", "\n")
    return text.encode("utf-8", "replace").decode("utf-8").strip()
