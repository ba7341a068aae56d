"""Writes made by reviewers: flags, notes and relabels on turns, one at a time or in bulk.

A reviewer's marks sit beside what was recorded and never change it (the recording
lifecycle is `rollouts.recording.services`; see its docstring for where a write goes).

Bulk flags run on the worker (`turn_bulk_flag_start` in the request, `turn_bulk_flag_run`
in the task): a filter can match millions of turns. A note set on many turns at once
(`turns_note_set`) is bounded instead, and written in the request.

Turns picked on the turn list can also go to a later app (a dataset's include list): that
app registers a `TurnCollection`, so that rollouts imports none of it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from rollouts.game.crafter_env import ACTION_INDEX
from rollouts.jobs import BULK_FLAG
from rollouts.models import Turn, TurnBulkFlag, TurnRelabel
from rollouts.review.selectors import turns_count
from rollouts.review.turn_selection import TurnSelection, turns_selected
from studio.jobs import JobOutcome

logger = logging.getLogger(__name__)

NOTE_MAX_LENGTH = 10_000
# A note says something of each turn it is on: set on at most this many at once.
BULK_NOTE_MAX_TURNS = 10_000


def turn_flag(*, turn: Turn, flagged: bool, user: AbstractBaseUser) -> Turn:
    """Set (not toggle) the flag, so that a request sent twice leaves the same state."""
    turn.flagged = flagged
    turn.reviewed_by = user
    turn.reviewed_at = timezone.now()
    turn.save(update_fields=["flagged", "reviewed_by", "reviewed_at"])
    return turn


def _note_text(note: str) -> str:
    text = note.replace("\r\n", "\n").strip()
    if len(text) > NOTE_MAX_LENGTH:
        raise ValueError(f"note: longer than {NOTE_MAX_LENGTH} characters")
    return text


def turn_note(*, turn: Turn, note: str, user: AbstractBaseUser) -> Turn:
    text = _note_text(note)
    turn.note = text
    turn.reviewed_by = user
    turn.reviewed_at = timezone.now()
    turn.save(update_fields=["note", "reviewed_by", "reviewed_at"])
    return turn


def turns_note_set(*, selection: TurnSelection, note: str, user: AbstractBaseUser) -> int:
    """The same note on every turn `selection` matches, replacing theirs (empty: no note);
    how many turns it was set on. Refused past BULK_NOTE_MAX_TURNS turns, none written."""
    text = _note_text(note)
    ids = list(
        turns_selected(selection).order_by().values_list("id", flat=True)[: BULK_NOTE_MAX_TURNS + 1]
    )
    if len(ids) > BULK_NOTE_MAX_TURNS:
        raise ValueError(
            f"note: more than {BULK_NOTE_MAX_TURNS:,} turns match; a note is set on at most "
            f"{BULK_NOTE_MAX_TURNS:,} at once: narrow the filter"
        )
    return Turn.objects.filter(id__in=ids).update(
        note=text, reviewed_by=user, reviewed_at=timezone.now()
    )


@dataclass(frozen=True)
class TurnCollection:
    """Where a later app keeps turns picked on the turn list (curation: a dataset's include
    list), registered by that app (`turn_collection_register`): the turn list offers "add to
    <noun>" without rollouts importing it."""

    noun: str  # "dataset": the action's name and the confirmation's word
    permission: str  # who may add to one
    # What turns can be added to: (id, name), the likeliest first.
    choices: Callable[[], list[tuple[int, str]]]
    # Adds the turns `selection` matches to the one with this id; how many were not in it
    # yet. ValueError: refused (too many, no such target), nothing written; its message
    # says why in one line.
    add: Callable[..., int]
    most: int | None = None  # the most turns one holds: the confirmation says so beforehand


_COLLECTIONS: dict[str, TurnCollection] = {}


def turn_collection_register(collection: TurnCollection) -> TurnCollection:
    """Offer `collection` on the turn list; registering it again (a module imported twice)
    replaces it."""
    _COLLECTIONS[collection.noun] = collection
    return collection


def turn_collections() -> list[TurnCollection]:
    return list(_COLLECTIONS.values())


def turn_bulk_flag_start(
    *, filters: TurnSelection, flagged: bool, user: AbstractBaseUser
) -> TurnBulkFlag:
    """A pending job for every turn `filters` matches; run by a Celery task once committed."""
    to_change = turns_selected(filters).exclude(flagged=flagged)
    total = turns_count(turns=to_change)
    with transaction.atomic():
        job = TurnBulkFlag.objects.create(
            filters=filters.to_json(),
            flagged=flagged,
            total=total.value,
            total_estimated=total.estimated,
            created_by=user,
        )
        BULK_FLAG.enqueue_on_commit(job.id)
    return job


def turn_bulk_flag_filters(*, job: TurnBulkFlag) -> TurnSelection:
    return TurnSelection.from_json(job.filters)


def turn_bulk_flag_run(*, job_id: int) -> JobOutcome:
    """Claim the job and apply it in chunks of STUDIO_BULK_FLAG_CHUNK turns, in id order.

    Each chunk is one transaction that also records progress and renews the claim, so a job
    taken over after a crash resumes after its last committed chunk, and a worker that lost
    its claim changes nothing more. Turns already in the wanted state keep their reviewer.
    """
    token = BULK_FLAG.claim(job_id)
    if token is None:
        return BULK_FLAG.unclaimed(job_id)
    claim = BULK_FLAG.held(job_id, token)
    job = TurnBulkFlag.objects.get(id=job_id)
    try:
        turns = turns_selected(turn_bulk_flag_filters(job=job)).exclude(flagged=job.flagged)
        last = job.last_turn_id
        chunk = max(1, settings.STUDIO_BULK_FLAG_CHUNK)
        while True:
            with transaction.atomic():
                ids = list(
                    turns.filter(id__gt=last).order_by("id").values_list("id", flat=True)[:chunk]
                )
                if not ids:
                    break
                changed = Turn.objects.filter(id__in=ids, flagged=not job.flagged).update(
                    flagged=job.flagged, reviewed_by=job.created_by, reviewed_at=timezone.now()
                )
                renewed = claim.renew(changed=F("changed") + changed, last_turn_id=ids[-1])
                if not renewed:
                    transaction.set_rollback(True)
                    return "claim_lost"
            last = ids[-1]
    except Exception as exc:
        logger.exception("bulk flag %s failed", job_id)
        claim.fail(str(exc))
        return "failed"
    claim.finish()
    return "done"


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
