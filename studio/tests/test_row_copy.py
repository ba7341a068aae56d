"""`copy_rows` writes what `bulk_create` writes (Django's own insert is the reference)."""

from __future__ import annotations

import datetime

import numpy as np
import pytest
from django.db import connection, transaction
from django.forms.models import model_to_dict
from django.test.utils import CaptureQueriesContext

from rollouts.models import Episode, Frame, RolloutBatch, Turn
from rollouts.recording import services
from rollouts.rollout_settings import RolloutSettings
from studio.row_copy import _plan, copy_rows

pytestmark = pytest.mark.django_db(transaction=True)

HOSTILE_JSON = {
    "text": 'caf\u00e9 \u2603 \U0001f600 tab\t newline\n quote" backslash\\ {}[]',
    "nested": [[[{"deep": [1, 2.5, -3e300, True, None]}]]],
    "empty": {},
}


def _rows(episode: Episode) -> tuple[list[Frame], list[Turn]]:
    frames = [
        Frame(
            episode=episode,
            step=np.int64(step),  # numpy integers, as a game's counters come
            sha256=f"{step:064x}",
            image=f"frames/{step:02x}/x/{step:064x}.png",
            width=64,
            height=np.int16(64),
            state={"step": step, **HOSTILE_JSON},
        )
        for step in range(3)
    ]
    turns = [
        Turn(
            episode=episode,
            index=i,
            frame=frames[i],  # set as an object, before it has an id
            observation_text="line one\nline two \\N not null \u00e9",
            request_messages=[{"role": "user", "content": [HOSTILE_JSON]}],
            model_text=None if i == 0 else "",
            tool_calls=[{"name": "interact", "arguments": '{"actions": ["noop"]}'}],
            actions=["noop", "do"],
            reward=np.float64(0.1) if i else -1.5,
            achievements_unlocked=["collect_wood"] if i == 2 else [],
            error="" if i else "tab\there",
            prompt_tokens=np.int64(2**31 - 1),
            latency_ms=7,
            flagged=bool(i % 2),
            note="",
            reviewed_at=datetime.datetime(2026, 12, 3, 12, 0, tzinfo=datetime.UTC) if i else None,
        )
        for i in range(3)
    ]
    return frames, turns


def _episode() -> Episode:
    batch = services.batch_create(
        settings=RolloutSettings(policy="random", seeds=(1,), steps=3), enqueue=False
    )
    return Episode.objects.get(batch=batch)


def _stored(model, ids: list[int]) -> list[dict]:
    fields = [f.name for f in model._meta.concrete_fields if f.name not in ("id", "episode")]
    by_id = {obj.id: obj for obj in model.objects.filter(id__in=ids)}
    rows = []
    for pk in ids:
        row = model_to_dict(by_id[pk], fields=fields)
        if "frame" in row:  # compare the frame it names by its step, not its id
            row["frame"] = Frame.objects.get(id=row["frame"]).step
        if "image" in row:
            row["image"] = row["image"].name
        rows.append(row)
    return rows


def test_it_stores_the_rows_bulk_create_stores():
    copied_episode, reference_episode = _episode(), _episode()
    frames, turns = _rows(copied_episode)
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        copy_rows(frames, turns)
    # Both groups' ids in one statement (the COPYs go around Django's query log).
    assert len(queries) == 1 and "nextval" in queries[0]["sql"]
    ref_frames, ref_turns = _rows(reference_episode)
    Frame.objects.bulk_create(ref_frames)
    Turn.objects.bulk_create(ref_turns)

    assert all(f.pk is not None and not f._state.adding for f in frames + turns)
    assert [t.frame_id for t in turns] == [f.pk for f in frames]
    assert _stored(Frame, [f.pk for f in frames]) == _stored(Frame, [f.pk for f in ref_frames])
    assert _stored(Turn, [t.pk for t in turns]) == _stored(Turn, [t.pk for t in ref_turns])
    stored = Turn.objects.get(pk=turns[1].pk)
    # (jsonb keeps numbers as numeric: -3e300 reads back as an int, on both paths alike.)
    assert stored.request_messages[0]["content"][0]["text"] == HOSTILE_JSON["text"]
    assert stored.model_text == "" and Turn.objects.get(pk=turns[0].pk).model_text is None
    # The next row the ORM writes gets an id of its own (the sequence moved past ours).
    extra = Frame.objects.create(
        episode=copied_episode, step=9, sha256="f" * 64, image="x.png", width=1, height=1
    )
    assert extra.pk > max(f.pk for f in frames + ref_frames)


def test_rows_written_again_after_a_rollback_keep_the_ids_they_point_to():
    episode = _episode()
    frames, turns = _rows(episode)
    with pytest.raises(RuntimeError), transaction.atomic():
        copy_rows(frames)
        copy_rows(turns)
        raise RuntimeError("the episode's end failed")
    assert not Frame.objects.filter(episode=episode).exists()
    # The recorder writes the same objects again: they keep their ids, none is drawn.
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        copy_rows(frames, turns)
    assert len(queries) == 0
    stored = dict(Turn.objects.filter(episode=episode).values_list("index", "frame__step"))
    assert stored == {0: 0, 1: 1, 2: 2}


def test_it_refuses_a_row_whose_related_object_is_not_saved():
    episode = _episode()
    _, turns = _rows(episode)
    with pytest.raises(ValueError, match="frame is not saved"), transaction.atomic():
        copy_rows(turns)


def test_models_with_fields_it_does_not_write_go_through_bulk_create():
    assert _plan(Frame) is not None and _plan(Turn) is not None
    assert _plan(RolloutBatch) is None  # created_at is auto_now_add: pre_save sets it
    episode = _episode()
    batch = RolloutBatch.objects.get(id=episode.batch_id)
    copy_rows([RolloutBatch(name="copied", policy="random", seeds=[1], settings={})])
    copied = RolloutBatch.objects.get(name="copied")
    assert copied.created_at >= batch.created_at
