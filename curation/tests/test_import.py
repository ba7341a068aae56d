"""import_jsonl: our rows, synth-ai SFT rows and OpenAI chat rows; all or nothing."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest
from PIL import Image

from curation.models import Dataset
from curation.tests.conftest import read_rows, run
from rollouts.models import Episode, Frame, RolloutBatch, Turn
from rollouts.recording.frame_store import FrameStore

pytestmark = pytest.mark.django_db

# Round trip: everything survives but the ids the studio gives imported data.
RENUMBERED = ("episode_id", "batch_id", "seed", "policy")


def _without_ids(rows: list[dict]) -> list[dict]:
    for row in rows:
        for key in RENUMBERED:
            row["metadata"].pop(key)
    return rows


def _data_url(image: Image.Image, fmt: str = "PNG") -> str:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    mime = {"PNG": "png", "JPEG": "jpeg", "WEBP": "webp", "GIF": "gif"}[fmt]
    return f"data:image/{mime};base64," + base64.b64encode(buffer.getvalue()).decode()


def _chat_row(i: int, url: str | None = None) -> dict:
    content: list[dict] = [{"type": "text", "text": f"observation {i}"}]
    if url:
        content.append({"type": "image_url", "image_url": {"url": url}})
    return {
        "messages": [
            {"role": "system", "content": "play well"},
            {"role": "user", "content": content},
            {"role": "assistant", "content": f"answer {i}"},
        ]
    }


def _write(path: Path, rows: list) -> Path:
    path.write_text(
        "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows),
        encoding="utf-8",
    )
    return path


def _counts() -> tuple[int, ...]:
    return (
        RolloutBatch.objects.count(),
        Episode.objects.count(),
        Frame.objects.count(),
        Turn.objects.count(),
        Dataset.objects.count(),
    )


def test_it_round_trips_export_import_export(scripted_batch, tmp_path):
    Turn.objects.filter(episode__seed=2, index=4).update(flagged=True)
    first = tmp_path / "first.jsonl"
    assert run("export_jsonl", "--output", str(first), "--history-frames", "2").code == 0
    # Its turns are still here: importing them again would duplicate every one.
    refused = run("import_jsonl", str(first))
    assert refused.code == 1 and "turn 0 of episode" in refused.stderr
    assert "90 of 90 lines are turns already in the studio" in refused.stderr
    Turn.objects.filter(episode__batch=scripted_batch).delete()
    scripted_batch.delete()
    imported = run("import_jsonl", str(first), "--name", "round trip")
    assert imported.code == 0, imported.stderr
    summary = imported.summary
    assert summary["turns"] == 90 and summary["episodes"] == 3 and summary["lines"] == 90
    batch = RolloutBatch.objects.get(id=summary["batch_id"])
    assert batch.policy == "imported" and batch.name == "round trip"
    assert sorted(batch.episodes.values_list("seed", flat=True)) == [0, 1, 2]
    second = tmp_path / "second.jsonl"
    again = run("export_jsonl", "--output", str(second), "--batch", str(batch.id))
    assert again.code == 0
    assert _without_ids(read_rows(second)) == _without_ids(read_rows(first))
    # Frames are stored once per distinct image and episode, as the exact PNG bytes.
    assert summary["frames"] == Frame.objects.filter(episode__batch=batch).count() == 90
    dataset = Dataset.objects.get(id=summary["dataset_id"])
    assert dataset.filters["batches"] == [batch.id]


def test_it_imports_openai_and_synth_ai_rows_that_can_be_flagged_and_exported(db, tmp_path):
    red = Image.new("RGB", (32, 24), (200, 10, 10))
    rows = [
        _chat_row(0, _data_url(red, "JPEG")),
        _chat_row(1),
        # synth-ai's SFT rows: messages + metadata, a session groups the turns of an episode
        {**_chat_row(2, _data_url(red)), "metadata": {"session_id": "s1", "has_image": True}},
        {**_chat_row(3, _data_url(red)), "metadata": {"session_id": "s1", "has_image": True}},
        {
            "messages": [
                {"role": "user", "content": "go"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {
                                "name": "interact_many",
                                "arguments": '{"actions": ["do", "noop"]}',
                            },
                        }
                    ],
                },
            ]
        },
    ]
    result = run("import_jsonl", str(_write(tmp_path / "mixed.jsonl", rows)))
    assert result.code == 0, result.stderr
    summary = result.summary
    assert summary["turns"] == 5 and summary["episodes"] == 4 and summary["images"] == 3
    turns = Turn.objects.filter(episode__batch_id=summary["batch_id"]).select_related("frame")
    jpeg_turn = turns.get(episode__seed=0)
    png = FrameStore().read(jpeg_turn.frame.image.name)
    with Image.open(io.BytesIO(png)) as stored:
        assert stored.format == "PNG" and stored.size == (32, 24)
    tool_turn = turns.get(episode__seed=3)
    assert tool_turn.actions == ["do", "noop"] and tool_turn.model_text is None
    session = turns.filter(episode__seed=2).order_by("index")
    assert [t.model_text for t in session] == ["answer 2", "answer 3"]

    turns.filter(episode__seed=0).update(flagged=True)
    out = tmp_path / "flagged.jsonl"
    exported = run(
        "export_jsonl",
        "--output",
        str(out),
        "--batch",
        str(summary["batch_id"]),
        "--flagged",
        "only",
    )
    assert exported.code == 0
    (row,) = read_rows(out)
    assert row["messages"][-1] == {"role": "assistant", "content": "answer 0"}
    assert row["metadata"]["flagged"] is True and row["metadata"]["user_has_image"] is True
    url = row["messages"][1]["content"][1]["image_url"]["url"]
    assert base64.b64decode(url.split(",", 1)[1]) == png


def test_it_refuses_a_broken_file_naming_every_line_and_imports_nothing(db, tmp_path, settings):
    good = _chat_row(0, _data_url(Image.new("RGB", (8, 8))))
    bomb = Image.new("1", (9000, 9000))  # tiny as PNG, 81 million pixels once decoded
    rows = [
        good,
        "{not json",
        {"messages": [{"role": "wizard", "content": "hi"}, {"role": "assistant", "content": "x"}]},
        _chat_row(3, "data:image/png;base64,!!!notbase64"),
        _chat_row(4, _data_url(bomb)),
        _chat_row(5, "https://example.invalid/cat.png"),
        {"messages": [{"role": "user", "content": "question without an answer"}]},
        _chat_row(7, _data_url(Image.new("RGB", (4, 4)), "GIF")),
        {"messages": [{"role": "user", "content": [{"type": "audio"}]}]},
        good,
    ]
    before = _counts()
    result = run("import_jsonl", str(_write(tmp_path / "broken.jsonl", rows)))
    assert result.code == 1
    errors = result.stderr.strip().splitlines()
    assert [e.removeprefix("import_jsonl: error: ").split(":", 1)[0] for e in errors[:-1]] == [
        f"line {n}" for n in range(2, 10)
    ]
    assert "not JSON" in errors[0]
    assert "role 'wizard'" in errors[1]
    assert "not valid base64" in errors[2]
    assert "over the limit" in errors[3] or "decompression bomb" in errors[3]
    assert "not a data: URL" in errors[4]
    assert "the last message must be the assistant's answer" in errors[5]
    assert "GIF" in errors[6]
    assert "'audio'" in errors[7]
    assert "8 error(s) in the file, nothing imported" in errors[-1]
    assert _counts() == before
    # Frames are written only after every line passed: none of the good line's either.
    assert not (Path(settings.MEDIA_ROOT) / "frames").exists()


def test_it_rejects_an_oversized_image_and_a_missing_file(db, tmp_path):
    big = "data:image/png;base64," + "A" * (15 * 1024 * 1024)
    result = run("import_jsonl", str(_write(tmp_path / "big.jsonl", [_chat_row(0, big)])))
    assert result.code == 1 and "larger than 10485760 bytes" in result.stderr
    missing = run("import_jsonl", str(tmp_path / "nope.jsonl"))
    assert missing.code == 2 and "is not a file" in missing.stderr


def test_it_refuses_an_empty_file(db, tmp_path):
    result = run("import_jsonl", str(_write(tmp_path / "empty.jsonl", [])))
    assert result.code == 1 and "no rows" in result.stderr


def test_rows_that_offered_no_tools_export_none_and_rows_without_tools_get_the_games(db, tmp_path):
    # `"tools": []` says the row offered none (a probe question); no "tools" key says nothing,
    # and such a row is exported as a game turn is, with the game's one tool.
    image = _data_url(Image.new("RGB", (8, 8), (0, 90, 0)))
    none_offered = [{**_chat_row(i, image), "tools": []} for i in range(2)]
    unsaid = [_chat_row(i, image) for i in range(2, 4)]
    tools = {}
    for name, rows in (("none_offered", none_offered), ("unsaid", unsaid)):
        imported = run("import_jsonl", str(_write(tmp_path / f"{name}.jsonl", rows)))
        assert imported.code == 0, imported.stderr
        out = tmp_path / f"{name}-export.jsonl"
        batch = str(imported.summary["batch_id"])
        assert run("export_jsonl", "--output", str(out), "--batch", batch).code == 0
        exported = read_rows(out)
        assert [row["messages"][-1]["content"] for row in exported] == [
            row["messages"][-1]["content"] for row in rows
        ]
        tools[name] = [row["tools"] for row in exported]
    assert tools["none_offered"] == [[], []]
    names = [[tool["function"]["name"] for tool in row_tools] for row_tools in tools["unsaid"]]
    assert names == [["interact_many"], ["interact_many"]]
