"""Turns already in the studio: an import refuses them, or leaves them out when asked."""

from __future__ import annotations

import hashlib

from django.db import connection

from curation.importing.errors import MAX_ERRORS, ImportFailed
from curation.importing.plan import Plan


def text_sha(text: str | None) -> str:
    return "" if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


# The first key of the advisory locks an import takes (pg_advisory_xact_lock(int, int)), so
# they cannot meet a lock taken for anything else: "impt".
IMPORT_LOCK_CLASS = 0x696D7074


def refuse_imported_file(plan: Plan, *, skip_existing: bool) -> None:
    """Refuse a file whose exact bytes were imported before, whatever their format (rows
    from elsewhere carry no ids to compare)."""
    from rollouts.models import RolloutBatch

    earlier = (
        RolloutBatch.objects.filter(
            policy=RolloutBatch.Policy.IMPORTED, settings__imported_sha256=plan.sha256
        )
        .values_list("id", flat=True)
        .first()
    )
    if earlier is None:
        return
    if skip_existing:
        message = f"all {plan.lines} lines are turns already in the studio; nothing to import"
    else:
        message = (
            f"this file was imported already (batch {earlier}); import with "
            "--skip-existing (or tick 'Skip turns already here') to leave known turns out"
        )
    raise ImportFailed([message], 1)


def lock_file_and_refuse_imported(plan: Plan, *, skip_existing: bool) -> None:
    """The first thing of the write transaction: own this file's bytes, then ask again.

    The check of pass one ran outside any transaction, so two uploads of one file at once
    both passed it and both wrote (80 turns from 40 lines). Here the check and the write
    are one transaction: on PostgreSQL under an advisory lock on the file's sha256, held
    until commit, so the second import waits for the first and then finds its batch. On
    SQLite each write transaction begins IMMEDIATE (settings), which serialises them alone.
    """
    if connection.vendor == "postgresql":
        key = int.from_bytes(bytes.fromhex(plan.sha256[:8]), "big", signed=True)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [IMPORT_LOCK_CLASS, key])
    refuse_imported_file(plan, skip_existing=skip_existing)


def check_existing(plan: Plan, *, skip_existing: bool) -> None:
    """Refuse (or leave out) rows whose turn is already in the studio.

    A row names its origin in `metadata` (batch_id, episode_id, turn: an export of ours);
    it is the same turn when that turn exists with the same answer text and, if the row
    has an image, the same frame bytes. Rows from elsewhere carry no such ids.
    """
    from rollouts.models import Turn

    refuse_imported_file(plan, skip_existing=skip_existing)
    if not plan.origins:
        return
    by_episode: dict[int, list[int]] = {}
    for number, (_, episode_id, _, _, _) in plan.origins.items():
        by_episode.setdefault(episode_id, []).append(number)
    existing: dict[tuple[int, int, int], tuple[str, str]] = {}
    episode_ids = sorted(by_episode)
    for start in range(0, len(episode_ids), 500):
        rows = Turn.objects.filter(episode_id__in=episode_ids[start : start + 500]).values_list(
            "episode__batch_id", "episode_id", "index", "model_text", "frame__sha256"
        )
        for batch_id, episode_id, index, text, sha in rows.iterator(chunk_size=2000):
            existing[(batch_id, episode_id, index)] = (text_sha(text), sha)
    duplicates = []
    for number, (batch_id, episode_id, turn, answer_sha, image_sha) in sorted(plan.origins.items()):
        known = existing.get((batch_id, episode_id, turn))
        if known is None or known[0] != answer_sha or (image_sha and known[1] != image_sha):
            continue
        duplicates.append((number, batch_id, episode_id, turn))
    if not duplicates:
        return
    if not skip_existing:
        errors = [
            f"line {n}: turn {t} of episode {e} (batch {b}) is already in the studio"
            for n, b, e, t in duplicates[:MAX_ERRORS]
        ]
        errors.append(
            f"{len(duplicates)} of {plan.lines} lines are turns already in the studio; "
            "import with --skip-existing (or tick 'Skip turns already here') to leave them out"
        )
        raise ImportFailed(errors, len(duplicates))
    plan.skipped = {n for n, *_ in duplicates}
    if len(plan.skipped) == plan.lines:
        raise ImportFailed(
            [f"all {plan.lines} lines are turns already in the studio; nothing to import"], 1
        )
    groups: dict[tuple, list[tuple[int, int | None]]] = {}
    for group, members in plan.groups.items():
        kept = [m for m in members if m[0] not in plan.skipped]
        if kept:
            groups[group] = kept
    plan.groups = groups
