"""A reviewer's marks on a model's answer to a probe question: a flag and a note, as on turns
(`rollouts.review.services`). They sit beside what the model answered and never change it."""

from __future__ import annotations

from probes.models import ProbeAnswer
from rollouts.review.services import NOTE_MAX_LENGTH


def answer_flag(*, answer: ProbeAnswer, flagged: bool) -> ProbeAnswer:
    """Set (not toggle) the flag, so that a request sent twice leaves the same state."""
    answer.flagged = flagged
    answer.save(update_fields=["flagged"])
    return answer


def answer_note(*, answer: ProbeAnswer, note: str) -> ProbeAnswer:
    """Replace the answer's note (empty: no note). ValueError past NOTE_MAX_LENGTH."""
    text = note.replace("\r\n", "\n").strip()
    if len(text) > NOTE_MAX_LENGTH:
        raise ValueError(f"note: longer than {NOTE_MAX_LENGTH} characters")
    answer.note = text
    answer.save(update_fields=["note"])
    return answer
