"""Writes made by reviewers: flags and notes on turns, one at a time or in bulk."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet
from django.utils import timezone

from rollouts.models import Turn

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
