"""The export's bytes against golden files: rows, formats, splits, pairs, previews, summaries.

The episodes below are literal rows (ids, texts, actions, 2x2 PNGs) so that every line of the
golden files in `golden/` can be checked by hand against them. The files were written by the
export before it was split into parts and read line by line; a change to any byte of any
row fails here. After an intended change of the row format, rewrite them with
`STUDIO_GOLDEN_UPDATE=1` and read the diff.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from django.utils import timezone

from curation.export_options import ExportOptions
from curation.exporting import export_files, preview_rows
from curation.preferences import export_preference_files
from rollouts.game.tools import tool_call
from rollouts.models import Episode, Frame, RolloutBatch, Turn, TurnRelabel
from rollouts.recording.frame_store import FrameStore
from rollouts.review.turn_selection import TurnSelection

pytestmark = pytest.mark.django_db

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("STUDIO_GOLDEN_UPDATE") == "1"

# 2x2 RGB PNGs, one colour each: green, blue, brown, grey, yellow, red, cyan, white.
PNGS = [
    base64.b64decode(text)
    for text in (
        "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGNkaGBgYGBgYmBgYGBgAAAGKgCE5tEtPAAAAABJRU5ErkJggg==",
        "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGNkYPjPwMDAxMDAwMDAAAALHwEDmIWXfgAAAABJRU5ErkJggg==",
        "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGPsdhVmYGBgYmBgYGBgAAALRgDn5ng3GAAAAABJRU5ErkJggg==",
        "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGNsaGhgYGBgYmBgYGBgAAASKgGEzwCOrgAAAABJRU5ErkJggg==",
        "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGP8/5+BgYGBiYGBgYGBAQAZEQICnc4XwwAAAABJRU5ErkJggg==",
        "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGP8z8DAwMDAxMDAwMDAAAANHQEDasKb6QAAAABJRU5ErkJggg==",
        "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGNk+P+fgYGBiYGBgYGBAQAXEwICqgnfHgAAAABJRU5ErkJggg==",
        "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGP8//8/AwMDEwMDAwMDAwAkBgMB/DXemwAAAABJRU5ErkJggg==",
    )
]
TOOL = {
    "type": "function",
    "function": {
        "name": "interact_many",
        "description": "Act.",
        "parameters": {
            "type": "object",
            "properties": {"actions": {"type": "array", "items": {"type": "string"}}},
            "required": ["actions"],
        },
    },
}


def _episode(batch, *, id, seed, sample=0, unique=0, reward=0.0):
    return Episode.objects.create(
        id=id,
        batch=batch,
        seed=seed,
        sample=sample,
        status="finished",
        achievement_count=unique,
        total_reward=reward,
        achievements={"collect_wood": 1} if unique else {},
    )


def _frames(episode, pngs):
    store = FrameStore()
    frames = []
    for step, number in enumerate(pngs):
        sha256, name = store.put(PNGS[number])
        frames.append(
            Frame.objects.create(
                episode=episode, step=step, sha256=sha256, image=name, width=2, height=2
            )
        )
    return frames


def _turns(episode, frames, actions, by_index=None):
    for index, (frame, acts) in enumerate(zip(frames, actions, strict=True)):
        Turn.objects.create(
            episode=episode,
            index=index,
            frame=frame,
            observation_text=f'Turn {index}: grass \u00e0 gauche, "tree" ahead\n\u26cf',
            actions=acts,
            **(by_index or {}).get(index, {}),
        )


@pytest.fixture
def episodes(db):
    scripted = RolloutBatch.objects.create(
        id=9001, name="golden-scripted", policy="scripted", seeds=[1, 2], status="finished"
    )
    recorded = RolloutBatch.objects.create(
        id=9002,
        name="golden-recorded",
        policy="openai",
        model="golden-vlm",
        settings={"tools": [TOOL]},
        seeds=[3],
        status="finished",
    )
    # 9101 and 9104 play seed 1 on the same frames and part at turn 1: 9101 did better.
    first = _episode(scripted, id=9101, seed=1, unique=1, reward=1.0)
    _turns(
        first,
        _frames(first, [0, 1, 2, 3, 4, 5]),
        [["noop"], ["move_left"], ["do"], ["move_up"], ["move_left"], ["noop"]],
        {
            2: {"achievements_unlocked": ["collect_wood"], "reward": 1.0},
            3: {"flagged": True},
            4: {"text_fallback": True, "model_text": "I'll go left."},
            5: {"model_text": "Wait \u2603."},
        },
    )
    relabeled = Turn.objects.get(episode=first, index=5)
    TurnRelabel.objects.create(turn=relabeled, actions=["do", "do"], labeled_at=timezone.now())
    second = _episode(scripted, id=9102, seed=2)
    _turns(
        second,
        _frames(second, [6, 7, 0, 1, 2, 3]),
        [["move_right"]] * 6,
        {1: {"text_fallback": True, "model_text": "right"}},
    )
    TurnRelabel.objects.create(
        turn=Turn.objects.get(episode=second, index=1), actions=["noop"], labeled_at=timezone.now()
    )
    worse = _episode(scripted, id=9104, seed=1, sample=1)
    _turns(worse, _frames(worse, [0, 1, 7]), [["noop"], ["noop"], ["sleep"]])
    played = _episode(recorded, id=9103, seed=3, unique=0)
    frames = _frames(played, [2, 4, 6])
    for index in range(3):
        images = [
            {"type": "image_url", "image_url": {"frame_step": step, "detail": "low"}}
            for step in range(max(0, index - 1), index + 1)
        ]
        Turn.objects.create(
            episode=played,
            index=index,
            frame=frames[index],
            observation_text=f"obs {index}",
            request_messages=[
                {"role": "system", "content": "You play Crafter."},
                {"role": "user", "content": [{"type": "text", "text": f"obs {index}"}, *images]},
            ],
            model_text=f"Step {index}: up." if index != 1 else None,
            tool_calls=[tool_call(["move_up"], f"call_rec_{index}")],
            actions=["move_up"],
        )


def _check(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"{name} differs from its golden file"


def _summary(result) -> dict:
    data = result.summary()
    data["path"] = Path(data["path"]).name
    data["bytes"] = result.train.bytes
    if "val" in data:
        data["val"]["path"] = Path(data["val"]["path"]).name
        data["val"]["bytes"] = result.val.bytes
    data["reports"] = [r.summary() for r in result.reports]
    return data


EXPORTS = {
    "studio_history1": (TurnSelection(), ExportOptions(history_frames=1)),
    "studio_split": (TurnSelection(), ExportOptions(val_fraction=0.5)),
    "openai": (TurnSelection(), ExportOptions(format="openai")),
    "synth_text_fallback": (
        TurnSelection(include_text_fallback=True),
        ExportOptions(format="synth", history_frames=2),
    ),
    "recorded_only": (TurnSelection(batches=(9002,)), ExportOptions()),
}


@pytest.mark.parametrize("name", list(EXPORTS))
def test_rows_are_the_golden_bytes(episodes, tmp_path, name):
    filters, options = EXPORTS[name]
    out, val = tmp_path / "train.jsonl", tmp_path / "val.jsonl"
    result = export_files(filters=filters, options=options, output=out, val_output=val)
    _check(f"{name}.jsonl", out.read_text(encoding="utf-8"))
    if result.val is not None:
        _check(f"{name}.val.jsonl", val.read_text(encoding="utf-8"))
    _check(f"{name}.summary.json", json.dumps(_summary(result), indent=1) + "\n")


@pytest.mark.parametrize("row_format", ["studio", "openai"])
def test_preference_rows_are_the_golden_bytes(episodes, tmp_path, row_format):
    out = tmp_path / "pairs.jsonl"
    result = export_preference_files(
        filters=TurnSelection(batches=(9001,)),
        options=ExportOptions(kind="preference", format=row_format),
        output=out,
    )
    assert result.train.rows == 1
    _check(f"preference_{row_format}.jsonl", out.read_text(encoding="utf-8"))


def test_the_preview_is_the_golden_rows(episodes):
    rows = preview_rows(
        filters=TurnSelection(user_image=True), options=ExportOptions(history_frames=1), limit=4
    )
    _check("preview.json", json.dumps(rows, indent=1, ensure_ascii=False) + "\n")
