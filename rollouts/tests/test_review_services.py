"""Review writes: flags and notes on one turn, and bulk flags over a filter."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from django.utils import timezone

from rollouts.jobs import BULK_FLAG
from rollouts.models import Episode, Turn, TurnBulkFlag
from rollouts.recording import services
from rollouts.review import services as services_review
from rollouts.review.turn_selection import EVERY_TURN, turns_selected
from rollouts.review.viewer import request_image_steps
from rollouts.rollout_settings import RolloutSettings
from studio.testing import JOB_ENDS, wait_for_row

pytestmark = pytest.mark.django_db


def _played(steps: int, seeds: tuple[int, ...] = (1,)) -> list[Episode]:
    batch = services.batch_run_inline(
        settings=RolloutSettings(policy="scripted", seeds=seeds, steps=steps)
    )
    assert batch.episodes_finished == len(seeds), batch.error
    return list(batch.episodes.order_by("seed"))


def test_it_sets_the_flag_and_remembers_who(editor):
    (episode,) = _played(3)
    turn = episode.turns.get(index=1)
    services_review.turn_flag(turn=turn, flagged=True, user=editor)
    services_review.turn_flag(turn=turn, flagged=True, user=editor)  # twice: same state
    turn.refresh_from_db()
    assert turn.flagged is True
    assert turn.reviewed_by == editor
    assert turn.reviewed_at is not None
    services_review.turn_flag(turn=turn, flagged=False, user=editor)
    turn.refresh_from_db()
    assert turn.flagged is False


def test_it_stores_a_trimmed_note_and_refuses_a_huge_one(editor):
    (episode,) = _played(2)
    turn = episode.turns.get(index=0)
    services_review.turn_note(turn=turn, note="  walks into water\r\nagain  ", user=editor)
    turn.refresh_from_db()
    assert turn.note == "walks into water\nagain"
    with pytest.raises(ValueError, match="note"):
        services_review.turn_note(
            turn=turn, note="x" * (services_review.NOTE_MAX_LENGTH + 1), user=editor
        )
    turn.refresh_from_db()
    assert turn.note == "walks into water\nagain"


def test_it_bulk_flags_every_match_in_chunks_and_counts_only_changes(editor, admin_user, settings):
    settings.STUDIO_BULK_FLAG_CHUNK = 3  # 10 turns to change: 4 chunks
    first, second = _played(5, seeds=(1, 2))
    already = first.turns.get(index=0)
    services_review.turn_flag(turn=already, flagged=True, user=admin_user)
    job = services_review.turn_bulk_flag_start(
        filters=replace(EVERY_TURN, batches=(first.batch_id,)), flagged=True, user=editor
    )
    total = first.turns.count() + second.turns.count()
    assert total == 10
    assert (job.status, job.total, job.total_estimated) == ("pending", 9, False)
    assert not Turn.objects.filter(flagged=True).exclude(id=already.id).exists()  # not yet
    assert services_review.turn_bulk_flag_run(job_id=job.id) == "done"
    job.refresh_from_db()
    assert (job.status, job.changed, job.percent) == ("done", 9, 100)
    assert job.last_turn_id == max(Turn.objects.values_list("id", flat=True))
    assert Turn.objects.filter(flagged=True).count() == 10
    already.refresh_from_db()
    assert already.reviewed_by == admin_user  # untouched: it was flagged already
    assert set(Turn.objects.exclude(id=already.id).values_list("reviewed_by", flat=True)) == {
        editor.id
    }
    # Delivered again: the row says done, nothing runs twice.
    assert services_review.turn_bulk_flag_run(job_id=job.id) == "done_already"
    undo = services_review.turn_bulk_flag_start(
        filters=replace(EVERY_TURN, flagged="only"), flagged=False, user=editor
    )
    assert services_review.turn_bulk_flag_run(job_id=undo.id) == "done"
    undo.refresh_from_db()
    assert undo.changed == 10
    assert not Turn.objects.filter(flagged=True).exists()


def test_it_resumes_a_bulk_flag_whose_worker_died_after_its_last_chunk(editor, settings):
    settings.STUDIO_BULK_FLAG_CHUNK = 4
    (episode,) = _played(12)
    job = services_review.turn_bulk_flag_start(filters=EVERY_TURN, flagged=True, user=editor)
    ids = list(episode.turns.order_by("id").values_list("id", flat=True))
    # A worker flagged the first 4 turns, saved its progress and died.
    Turn.objects.filter(id__in=ids[:4]).update(flagged=True)
    stale = timezone.now() - BULK_FLAG.stale_after() - timedelta(seconds=1)
    TurnBulkFlag.objects.filter(id=job.id).update(
        status="running", claim_token="dead", heartbeat_at=stale, changed=4, last_turn_id=ids[3]
    )
    assert services_review.turn_bulk_flag_run(job_id=job.id) == "done"
    job.refresh_from_db()
    assert (job.changed, job.status) == (12, "done")
    assert Turn.objects.filter(flagged=True).count() == 12
    # A fresh claim is respected: a second delivery steps back.
    running = services_review.turn_bulk_flag_start(filters=EVERY_TURN, flagged=False, user=editor)
    TurnBulkFlag.objects.filter(id=running.id).update(
        status="running", claim_token="alive", heartbeat_at=timezone.now()
    )
    assert services_review.turn_bulk_flag_run(job_id=running.id) == "busy"
    assert Turn.objects.filter(flagged=True).count() == 12


def test_it_filters_turns_by_unlocked_achievement_error_and_model(editor):
    (episode,) = _played(6)
    Turn.objects.filter(episode=episode, index=2).update(achievements_unlocked=["collect_wood"])
    Turn.objects.filter(episode=episode, index=3).update(
        achievements_unlocked=["collect_stone", "place_stone"], error="bad", error_kind="json"
    )
    wood = turns_selected(replace(EVERY_TURN, turn_unlocked=("collect_wood",)))
    assert list(wood.values_list("index", flat=True)) == [2]
    stone = turns_selected(replace(EVERY_TURN, turn_unlocked=("place_stone",)))
    assert list(stone.values_list("index", flat=True)) == [3]
    assert not turns_selected(replace(EVERY_TURN, turn_unlocked=("collect_diamond",))).exists()
    errors = turns_selected(replace(EVERY_TURN, has_error="yes"))
    assert list(errors.values_list("index", flat=True)) == [3]
    assert turns_selected(replace(EVERY_TURN, has_error="no")).count() == episode.turns.count() - 1
    assert not turns_selected(replace(EVERY_TURN, models=("gpt-none",))).exists()
    with pytest.raises(ValueError, match="unknown achievement"):
        turns_selected(replace(EVERY_TURN, turn_unlocked=("collect_unicorns",)))


def test_it_reads_the_frame_steps_of_image_parts():
    messages = [
        {"role": "system", "content": "rules"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "obs"},
                {"type": "image_url", "image_url": {"frame_step": 4}},
                {"type": "image_url", "image_url": {"frame_step": 5}},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
            ],
        },
    ]
    assert request_image_steps(messages) == [4, 5]
    assert request_image_steps([]) == []
    assert request_image_steps("garbage") == []


def test_it_sends_again_a_bulk_flag_whose_message_never_left(celery_worker, editor):
    (episode,) = _played(6)
    # As if the broker was down when it was asked for: pending, never handed over.
    job = TurnBulkFlag.objects.create(filters={}, flagged=True, total=6, created_by=editor)
    TurnBulkFlag.objects.filter(id=job.id).update(created_at=timezone.now() - timedelta(minutes=5))
    assert len(BULK_FLAG.requeue()) == 1
    wait_for_row(job, statuses=JOB_ENDS)
    assert (job.status, job.changed) == ("done", 6) and job.enqueued_at is not None
    assert episode.turns.filter(flagged=True).count() == 6
    assert BULK_FLAG.requeue() == []  # nothing waits any more
