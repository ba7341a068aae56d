"""`export_hf`: read back with the real `datasets` library, offline, in a child process."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from curation import services
from curation.export_options import ExportOptions
from curation.jsonl import episode_split
from curation.tests.conftest import record, run
from curation.tests.hf_reader import read_hf, val_fraction_between
from rollouts.game.crafter_env import decode_png
from rollouts.models import Turn
from rollouts.recording.frame_store import FrameStore
from rollouts.review.turn_selection import TurnSelection

pytestmark = pytest.mark.django_db

COLUMNS = ("episode_id", "turn", "prompt", "completion", "tools", "seed", "batch_id")


def pixels_of(sha256_name: str) -> str:
    """What an image must decode to: the stored frame's RGB array, hashed, and its size."""
    array = decode_png(FrameStore().read(sha256_name))
    return hashlib.sha256(array.tobytes()).hexdigest() + f":{array.shape[1]}x{array.shape[0]}"


def placeholders(messages: list[dict]) -> int:
    return sum(1 for m in messages for p in m["content"] if p["type"] == "image")


def files_of(directory: Path) -> dict[str, bytes]:
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def test_it_loads_offline_with_images_equal_to_the_stored_frames(tmp_path):
    batch = record(seeds=(1, 2, 3, 4, 5, 6), steps=6)
    fraction = val_fraction_between(batch.id, (1, 2, 3, 4, 5, 6))
    output = tmp_path / "hf"
    result = services.hf_export(
        filters=TurnSelection(batches=(batch.id,)),
        options=ExportOptions(history_frames=1, val_fraction=fraction),
        output=output,
        shard_bytes=4000,  # several shards per split: they must load as one
    )
    assert result.splits["train"].shards > 1
    assert (output / "data").is_dir() and (output / "dataset_dict.json").is_file()
    read = read_hf(output, COLUMNS, tmp_path / "reader")
    assert read["parquet"] == read["disk"]  # the two ways of loading give the same rows
    splits = read["parquet"]
    assert set(splits) == {"train", "validation"}
    features = splits["train"]["features"]
    assert features["images"] == "List(Image(mode=None, decode=True))"
    assert read["card"]["features"] == features
    assert read["card"]["splits"] == {s: len(d["rows"]) for s, d in splits.items()}
    frames = {
        (t.episode_id, t.index): t.frame.image.name
        for t in Turn.objects.filter(episode__batch=batch).select_related("frame")
    }
    seen_episodes: dict[str, set[int]] = {"train": set(), "validation": set()}
    total = 0
    for split, data in splits.items():
        for row in data["rows"]:
            total += 1
            episode, turn = row["episode_id"], row["turn"]
            seen_episodes[split].add(episode)
            expected = [frames[(episode, turn - 1)]] if turn > 0 else []
            expected.append(frames[(episode, turn)])
            assert row["pixels"] == [pixels_of(name) for name in expected]
            assert placeholders(row["prompt"]) == len(row["pixels"])
            assert placeholders(row["completion"]) == 0
            (answer,) = row["completion"]
            assert answer["role"] == "assistant"
            (call,) = answer["tool_calls"]
            assert call["function"]["name"] == "interact_many"
            assert json.loads(row["tools"])[0]["function"]["name"] == "interact_many"
            want = "validation" if split == "validation" else "train"
            got = episode_split(batch_id=row["batch_id"], seed=row["seed"], val_fraction=fraction)
            assert {"val": "validation"}.get(got, got) == want
    assert total == 36 == result.summary()["rows"]
    assert not seen_episodes["train"] & seen_episodes["validation"]
    assert seen_episodes["train"] and seen_episodes["validation"]
    card = (output / "README.md").read_text()
    assert card.startswith("---\ndataset_info: ") and result.sha256 in card
    assert f'"id": {batch.id}' in card


def test_the_command_exports_the_same_data_to_the_same_bytes(tmp_path):
    batch = record(seeds=(3, 4), steps=5)
    fraction = val_fraction_between(batch.id, (3, 4))
    outputs = []
    for name in ("one", "two"):
        out = run(
            "export_hf", "--output", str(tmp_path / name), "--batch", str(batch.id),
            "--val-fraction", repr(fraction),
        )  # fmt: skip
        assert out.code == 0, out.stderr
        outputs.append(out.summary)
    assert outputs[0]["sha256"] == outputs[1]["sha256"]
    assert outputs[0]["rows"] == 10 and outputs[0]["images"] == 10
    one, two = files_of(tmp_path / "one"), files_of(tmp_path / "two")
    assert one == two and "README.md" in one
    assert any(name.startswith("data/train-00000-of-") for name in one)
    # A directory that already holds something is refused, and left as it was.
    again = run("export_hf", "--output", str(tmp_path / "one"), "--batch", str(batch.id))
    assert again.code == 2 and "exists and is not an empty directory" in again.stderr
    assert files_of(tmp_path / "one") == one


def test_tool_calls_as_text_renders_the_call_for_qwen_templates(tmp_path):
    batch = record(seeds=(7,), steps=2)
    out = run(
        "export_hf", "--output", str(tmp_path / "hf"), "--batch", str(batch.id),
        "--tool-calls-as-text",
    )  # fmt: skip
    assert out.code == 0, out.stderr
    (shard,) = sorted((tmp_path / "hf" / "data").glob("train-*.parquet"))
    rows = pq.read_table(shard).to_pylist()
    # The scripted policy's first two actions (synth-ai's list), written out by hand.
    expected = [
        '<tool_call>{"name": "interact_many", "arguments": {"actions": ["move_right"]}}'
        "</tool_call>",
        '<tool_call>{"name": "interact_many", "arguments": {"actions": ["move_down"]}}</tool_call>',
    ]
    for row, text in zip(rows, expected, strict=True):
        (answer,) = row["completion"]
        assert answer["tool_calls"] is None
        assert answer["content"] == [{"type": "text", "text": text}]
    schema = pq.read_schema(shard)
    meta = json.loads(schema.metadata[b"huggingface"])
    assert meta["info"]["features"]["images"] == {"feature": {"_type": "Image"}, "_type": "List"}


def test_it_refuses_bad_input_and_writes_nothing(tmp_path):
    out = run("export_hf", "--output", str(tmp_path / "x"), "--batch", "999")
    assert out.code == 2 and "there is no batch 999" in out.stderr
    missing = run("export_hf", "--output", str(tmp_path / "no" / "such"))
    assert missing.code == 2 and "does not exist" in missing.stderr
    assert not (tmp_path / "x").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp")] == []
