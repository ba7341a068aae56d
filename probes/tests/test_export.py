"""`export_jsonl --probe-set` and `export_hf --probe-set`: a probe set as training rows."""

from __future__ import annotations

import base64
import hashlib
import json

import numpy as np
import pytest
from django.core.files.storage import default_storage

from curation.tests.hf_reader import read_hf, val_fraction_between
from probes.models import ProbeQuestion
from probes.prompting import question_prompt
from probes.services import probe_set_create
from probes.tests.helpers import recorded, run
from rollouts.game.crafter_env import decode_png
from rollouts.review.turn_selection import TurnSelection

pytestmark = pytest.mark.django_db

SEEDS = (1, 2, 3, 4)


@pytest.fixture
def probe_set():
    batch = recorded(seeds=SEEDS, steps=12)
    return probe_set_create(
        filters=TurnSelection(batches=(batch.id,)), seed=3, per_episode=4, kinds=["count", "night"]
    )


def _png(question: ProbeQuestion) -> bytes:
    with default_storage.open(question.frame.image.name, "rb") as fh:
        return fh.read()


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _image_bytes(row: dict) -> list[bytes]:
    return [
        base64.b64decode(part["image_url"]["url"].split(",", 1)[1])
        for message in row["messages"]
        if isinstance(message["content"], list)
        for part in message["content"]
        if part["type"] == "image_url"
    ]


def test_it_writes_a_row_per_question_with_the_stored_frame_and_the_right_answer(
    probe_set, tmp_path
):
    output = tmp_path / "probes.jsonl"
    outcome = run("export_jsonl", "--probe-set", str(probe_set.id), "--output", str(output))
    assert outcome.code == 0, outcome.stderr
    rows = _rows(output)
    questions = list(
        ProbeQuestion.objects.filter(probe_set=probe_set).order_by("index").select_related("frame")
    )
    assert len(rows) == len(questions) == probe_set.questions_count == 4 * 4 * 11
    summary = outcome.summary
    assert summary["rows"] == len(rows) and summary["images"] == len(rows)
    assert summary["episodes"] == len(SEEDS)
    assert summary["sha256"] == hashlib.sha256(output.read_bytes()).hexdigest()
    assert summary["path"] == str(output)
    for row, question in zip(rows, questions, strict=True):
        assert _image_bytes(row) == [_png(question)]  # exactly the stored PNG
        # The reply the prompt asks for: the right choice's letter, worked out here.
        letter = "ABCDEFGHIJ"[question.choices.index(question.answer)]
        assert row["messages"][-1] == {"role": "assistant", "content": letter}
        texts = [p["text"] for p in row["messages"][1]["content"] if p["type"] == "text"]
        assert question_prompt(question.text, question.choices) in texts
        meta = row["metadata"]
        assert (meta["question"], meta["kind"], meta["subject"]) == (
            question.index,
            question.kind,
            question.subject,
        )
        assert meta["answer"] == question.answer and meta["choices"] == question.choices
        assert meta["episode_id"] == question.episode_id
        assert meta["frame_step"] == question.frame.step
        assert meta["split"] == "train"


def test_it_splits_by_episode_and_the_openai_format_has_no_metadata(probe_set, tmp_path):
    batch_id = ProbeQuestion.objects.filter(probe_set=probe_set).first().episode.batch_id
    fraction = val_fraction_between(batch_id, SEEDS)
    train, val = tmp_path / "train.jsonl", tmp_path / "val.jsonl"
    outcome = run(
        "export_jsonl",
        "--probe-set",
        str(probe_set.id),
        "--output",
        str(train),
        "--val-fraction",
        str(fraction),
        "--val-output",
        str(val),
    )
    assert outcome.code == 0, outcome.stderr
    train_rows, val_rows = _rows(train), _rows(val)
    train_episodes = {r["metadata"]["episode_id"] for r in train_rows}
    val_episodes = {r["metadata"]["episode_id"] for r in val_rows}
    assert train_episodes and val_episodes and not train_episodes & val_episodes
    assert len(train_rows) + len(val_rows) == probe_set.questions_count
    assert outcome.summary["val"]["rows"] == len(val_rows)
    # The documented rule: sha256 of "batch:seed", its first 8 bytes as a fraction.
    for row in val_rows:
        meta = row["metadata"]
        digest = hashlib.sha256(f"{meta['batch_id']}:{meta['seed']}".encode()).digest()
        assert int.from_bytes(digest[:8], "big") / 2**64 < fraction
        assert meta["split"] == "val"

    plain = tmp_path / "openai.jsonl"
    outcome = run(
        "export_jsonl",
        "--probe-set",
        str(probe_set.id),
        "--output",
        str(plain),
        "--format",
        "openai",
    )
    assert outcome.code == 0, outcome.stderr
    rows = _rows(plain)
    assert len(rows) == probe_set.questions_count
    assert all(set(r) == {"messages"} for r in rows)


def test_it_exports_a_hugging_face_dataset_with_the_frames_embedded(probe_set, tmp_path):
    batch_id = ProbeQuestion.objects.filter(probe_set=probe_set).first().episode.batch_id
    fraction = val_fraction_between(batch_id, SEEDS)
    output = tmp_path / "hf"
    outcome = run(
        "export_hf",
        "--probe-set",
        str(probe_set.id),
        "--output",
        str(output),
        "--val-fraction",
        str(fraction),
    )
    assert outcome.code == 0, outcome.stderr
    assert outcome.summary["kind"] == "probe"
    read = read_hf(output, ("question", "kind", "answer", "completion", "prompt"), tmp_path / "r")
    assert read["parquet"] == read["disk"]
    splits = read["parquet"]
    assert set(splits) == {"train", "validation"}
    questions = {
        q.index: q
        for q in ProbeQuestion.objects.filter(probe_set=probe_set).select_related("frame")
    }
    seen = 0
    for split in splits.values():
        for row in split["rows"]:
            question = questions[row["question"]]
            pixels = decode_png(_png(question))
            expected = hashlib.sha256(np.ascontiguousarray(pixels).tobytes()).hexdigest()
            assert row["pixels"] == [f"{expected}:64x64"]
            assert (row["kind"], row["answer"]) == (question.kind, question.answer)
            letter = "ABCDEFGHIJ"[question.choices.index(question.answer)]
            assert row["completion"][0]["content"][0]["text"] == letter
            # TRL's placeholder where the image was, one for the one image.
            parts = [p for m in row["prompt"] for p in m["content"]]
            assert sum(p["type"] == "image" for p in parts) == 1
            seen += 1
    assert seen == probe_set.questions_count


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--batch", "1"], "--batch: --probe-set exports the set's questions"),
        (["--kind", "preference"], "--kind: --probe-set exports the set's questions"),
        (["--history-frames", "2"], "--history-frames: --probe-set"),
        (["--val-fraction", "1.5"], "val-fraction: 1.5 is not in [0, 1)"),
    ],
)
def test_it_refuses_turn_options_with_a_probe_set_and_writes_nothing(
    probe_set, tmp_path, extra, message
):
    out = tmp_path / "out"
    out.mkdir()
    outcome = run(
        "export_jsonl", "--probe-set", str(probe_set.id), "--output", str(out / "x.jsonl"), *extra
    )
    assert outcome.code == 2
    assert message in outcome.stderr
    assert not list(out.iterdir())


def test_it_refuses_a_set_that_does_not_exist(db, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for command, target in (("export_jsonl", "x.jsonl"), ("export_hf", "hf")):
        outcome = run(command, "--probe-set", "424242", "--output", str(out / target))
        assert outcome.code == 2
        assert "probe-set: there is no probe set 424242" in outcome.stderr
    assert not list(out.iterdir())
