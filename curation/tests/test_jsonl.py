"""The row builder alone: canonical JSON, stable split, achievements."""

from __future__ import annotations

import json

from curation.jsonl import (
    EpisodeContext,
    FrameRef,
    RowBuilder,
    TurnRecord,
    cumulative_unique,
    episode_split,
)
from rollouts.game.tools import INTERACT_MANY_TOOL, SYSTEM_PROMPT, tool_call

PNG = b"\x89PNG fake bytes, never decoded here"


def _record(**kwargs) -> TurnRecord:
    values = {
        "episode_id": 7,
        "index": 2,
        "observation_text": 'Step 2 of 9. "quoted" ünïcode <b>',
        "request_messages": [],
        "model_text": None,
        "tool_calls": [],
        "actions": ["move_left", "do"],
        "reward": 1.0,
        "achievements_unlocked": ["collect_wood"],
        "flagged": True,
        "frame": FrameRef("a" * 64, "frames/a.png"),
    }
    values.update(kwargs)
    return TurnRecord(**values)


def _episode(**kwargs) -> EpisodeContext:
    values = {
        "episode_id": 7,
        "batch_id": 3,
        "seed": 11,
        "model": "m\u00e9",
        "policy": "scripted",
        "cumulative": {0: 0, 1: 1, 2: 2},
    }
    values.update(kwargs)
    return EpisodeContext(**values)


def test_it_builds_exactly_what_json_dumps_writes():
    builder = RowBuilder(load_png=lambda frame: PNG)
    built = builder.row(_record(), _episode(), split="val")
    row = json.loads(built.text)
    assert built.text == json.dumps(row, ensure_ascii=False) + "\n"
    assert row["messages"][0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert row["messages"][2]["tool_calls"] == [tool_call(["move_left", "do"], "call_7_2")]
    assert row["tools"] == [INTERACT_MANY_TOOL]
    assert row["metadata"]["achievements"] == {
        "new_unique": ["collect_wood"],
        "cumulative_unique": 2,
    }
    assert row["metadata"]["model"] == "m\u00e9" and row["metadata"]["split"] == "val"


def test_it_keeps_model_text_and_the_tool_calls_the_model_made():
    calls = [
        {"id": "x1", "type": "function", "function": {"name": "interact_many", "arguments": "{}"}}
    ]
    built = RowBuilder(load_png=lambda f: PNG).row(
        _record(model_text="I will <script>", tool_calls=calls), _episode()
    )
    assistant = json.loads(built.text)["messages"][-1]
    assert assistant == {"role": "assistant", "content": "I will <script>", "tool_calls": calls}


def test_it_drops_metadata_in_the_openai_format():
    built = RowBuilder(load_png=lambda f: PNG, row_format="openai").row(_record(), _episode())
    assert list(json.loads(built.text)) == ["messages", "tools"]


def test_it_reads_each_frame_once_while_it_is_reused():
    reads = []
    builder = RowBuilder(load_png=lambda f: reads.append(f) or PNG, history_frames=3)
    frames = {i: FrameRef(f"{i:064x}", f"f{i}") for i in range(6)}
    episode = _episode(turn_frames=frames)
    for i in range(6):
        builder.row(_record(index=i, frame=frames[i]), episode)
    assert len(reads) == 6


def test_it_splits_by_a_stable_hash_of_the_episode():
    splits = [episode_split(batch_id=1, seed=s, val_fraction=0.25) for s in range(400)]
    assert splits == [episode_split(batch_id=1, seed=s, val_fraction=0.25) for s in range(400)]
    assert 60 < splits.count("val") < 140
    assert episode_split(batch_id=1, seed=5, val_fraction=0.0) == "train"


def test_it_counts_unique_achievements_cumulatively():
    assert cumulative_unique([(2, ["b"]), (0, []), (1, ["a"]), (3, [])]) == {0: 0, 1: 1, 2: 2, 3: 2}


def test_a_running_count_gives_the_cumulative_count_of_every_turn():
    from curation.jsonl import RunningCount

    unlocked = [(2, ["b"]), (0, []), (1, ["a"]), (3, []), (4, ["a", "c"]), (5, [])]
    only_unlocks = [(index, names) for index, names in unlocked if names]
    running = RunningCount(only_unlocks)
    assert [running.get(index) for index in range(6)] == [0, 1, 2, 2, 3, 3]


def test_flat_values_are_encoded_as_json_dumps_encodes_them():
    from curation.jsonl import _dumps_flat

    for value in [
        "plain",
        'quote " back \\ slash \n\t\x01 caf\u00e9 \u2603 \ud83d\ude00',
        {},
        {"type": "text", "text": "a \u00e9\n"},
        {"type": "text", "n": 1},
        ["a"],
        None,
        1.5,
    ]:
        assert _dumps_flat(value) == json.dumps(value, ensure_ascii=False)
