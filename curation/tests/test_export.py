"""export_jsonl: the row format (docs/formats.md), filters, split, stability, provider limits."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

from curation.jsonl import SYSTEM_MESSAGE_JSON, episode_split
from curation.tests.conftest import read_rows, record, run
from curation.validation import validate_openai_file
from rollouts.game.crafter_env import ACHIEVEMENTS
from rollouts.game.tools import INTERACT_MANY_TOOL, SYSTEM_PROMPT, tool_call
from rollouts.models import Episode, Frame, Turn
from rollouts.recording.frame_store import FrameStore
from rollouts.tests import openai_server as replies
from studio.testing import manage, subprocess_env

pytestmark = pytest.mark.django_db

PREFIX = "data:image/png;base64,"
METADATA_KEYS = [
    "episode_id",
    "batch_id",
    "seed",
    "turn",
    "model",
    "policy",
    "achievements",
    "reward",
    "user_has_image",
    "assistant_has_image",
    "has_image",
    "flagged",
    "split",
]


def _png(part: dict) -> bytes:
    url = part["image_url"]["url"]
    assert url.startswith(PREFIX)
    return base64.b64decode(url[len(PREFIX) :])


def _stored(frame: Frame) -> bytes:
    return FrameStore().read(frame.image.name)


def test_it_writes_one_row_per_turn_in_the_spec_format(scripted_batch, tmp_path):
    out = tmp_path / "rows.jsonl"
    result = run("export_jsonl", "--output", str(out))
    assert result.code == 0, result.stderr
    turns = list(Turn.objects.select_related("episode", "frame").order_by("episode_id", "index"))
    rows = read_rows(out)
    assert len(rows) == len(turns) == 90
    summary = result.summary
    assert summary["rows"] == 90 and summary["episodes"] == 3 and summary["images"] == 90
    assert summary["path"] == str(out)
    assert summary["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    for row, turn in zip(rows, turns, strict=True):
        assert list(row) == ["messages", "tools", "metadata"]
        system, user, assistant = row["messages"]
        assert system == {"role": "system", "content": SYSTEM_PROMPT}
        assert user["role"] == "user"
        assert user["content"][0] == {"type": "text", "text": turn.observation_text}
        # The image is exactly the stored PNG of the frame the turn showed.
        assert _png(user["content"][1]) == _stored(turn.frame)
        assert assistant["content"] is None
        call_id = f"call_{turn.episode_id}_{turn.index}"
        assert assistant["tool_calls"] == [tool_call(turn.actions, call_id)]
        assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {
            "actions": turn.actions
        }
        assert row["tools"] == [INTERACT_MANY_TOOL]
        meta = row["metadata"]
        assert list(meta) == METADATA_KEYS
        assert meta["episode_id"] == turn.episode_id
        assert meta["batch_id"] == scripted_batch.id
        assert meta["seed"] == turn.episode.seed
        assert meta["turn"] == turn.index
        assert meta["policy"] == "scripted"
        assert meta["achievements"]["new_unique"] == turn.achievements_unlocked
        assert meta["reward"] == turn.reward
        assert meta["user_has_image"] is True and meta["has_image"] is True
        assert meta["assistant_has_image"] is False
        assert meta["flagged"] is False and meta["split"] == "train"


def test_it_counts_cumulative_achievements_per_episode(scripted_batch, tmp_path):
    out = tmp_path / "rows.jsonl"
    assert run("export_jsonl", "--output", str(out)).code == 0
    by_episode: dict[int, list[dict]] = {}
    for row in read_rows(out):
        by_episode.setdefault(row["metadata"]["episode_id"], []).append(row["metadata"])
    assert any(m["achievements"]["new_unique"] for ms in by_episode.values() for m in ms)
    for episode_id, metas in by_episode.items():
        seen: set[str] = set()
        for meta in metas:
            seen.update(meta["achievements"]["new_unique"])
            assert meta["achievements"]["cumulative_unique"] == len(seen)
        assert len(seen) == Episode.objects.get(id=episode_id).achievement_count


def test_it_writes_canonical_json_the_same_bytes_every_time(scripted_batch, tmp_path):
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a = run("export_jsonl", "--output", str(first), "--history-frames", "2")
    b = run("export_jsonl", "--output", str(second), "--history-frames", "2")
    assert a.code == b.code == 0
    assert first.read_bytes() == second.read_bytes()
    assert a.summary["sha256"] == b.summary["sha256"]
    for line in first.read_text(encoding="utf-8").splitlines(keepends=True):
        # Spliced from pre-serialised pieces, yet exactly what json.dumps writes.
        assert json.dumps(json.loads(line), ensure_ascii=False) + "\n" == line
        assert line.startswith('{"messages": [' + SYSTEM_MESSAGE_JSON)


def test_it_adds_history_frames_oldest_first(scripted_batch, tmp_path):
    out = tmp_path / "rows.jsonl"
    result = run("export_jsonl", "--output", str(out), "--history-frames", "2")
    episode = scripted_batch.episodes.order_by("seed").first()
    frames = {
        t.index: _stored(t.frame) for t in episode.turns.select_related("frame").order_by("index")
    }
    rows = [r for r in read_rows(out) if r["metadata"]["episode_id"] == episode.id]
    assert [len(r["messages"][1]["content"]) - 1 for r in rows[:4]] == [1, 2, 3, 3]
    images = [_png(p) for p in rows[5]["messages"][1]["content"][1:]]
    assert images == [frames[3], frames[4], frames[5]]
    assert result.summary["images"] == sum(min(i, 2) + 1 for i in range(30)) * 3


def test_it_keeps_exactly_the_image_rows_with_synth_ai_filter_logic(scripted_batch, tmp_path):
    # A text-only chat row, imported, sits beside the recorded image rows.
    text_rows = tmp_path / "text.jsonl"
    text_rows.write_text(
        "".join(
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": f"question {i}"},
                        {"role": "assistant", "content": f"answer {i}"},
                    ]
                }
            )
            + "\n"
            for i in range(3)
        )
    )
    assert run("import_jsonl", str(text_rows)).code == 0
    out = tmp_path / "all.jsonl"
    assert run("export_jsonl", "--output", str(out)).code == 0

    # examples/vlm/filter_image_rows.py, its filtering logic as it is.
    kept = []
    for line in out.read_text(encoding="utf-8").splitlines():
        try:
            record_ = json.loads(line)
        except json.JSONDecodeError:
            continue
        metadata = record_.get("metadata") or {}
        has_user_image = bool(metadata.get("user_has_image"))
        if not has_user_image:
            continue
        kept.append(record_)

    def shows_image(row: dict) -> bool:
        return any(
            isinstance(m["content"], list) and any(p["type"] == "image_url" for p in m["content"])
            for m in row["messages"]
        )

    rows = read_rows(out)
    assert len(rows) == 93
    assert kept == [r for r in rows if shows_image(r)]
    assert len(kept) == 90
    # The exporter's own --user-image flag gives the same rows.
    flagged_out = tmp_path / "images.jsonl"
    assert run("export_jsonl", "--output", str(flagged_out), "--user-image").code == 0
    assert read_rows(flagged_out) == kept


def test_it_splits_by_episode_without_leakage(db, tmp_path):
    batch = record(seeds=tuple(range(12)), steps=4)
    train, val = tmp_path / "train.jsonl", tmp_path / "val.jsonl"
    args = ["--output", str(train), "--val-fraction", "0.3", "--val-output", str(val)]
    result = run("export_jsonl", *args)
    assert result.code == 0, result.stderr
    train_rows, val_rows = read_rows(train), read_rows(val)
    train_eps = {r["metadata"]["episode_id"] for r in train_rows}
    val_eps = {r["metadata"]["episode_id"] for r in val_rows}
    assert train_eps and val_eps and not train_eps & val_eps
    assert train_eps | val_eps == set(batch.episodes.values_list("id", flat=True))
    assert {r["metadata"]["split"] for r in train_rows} == {"train"}
    assert {r["metadata"]["split"] for r in val_rows} == {"val"}
    for row in val_rows:
        meta = row["metadata"]
        assert episode_split(batch_id=meta["batch_id"], seed=meta["seed"], val_fraction=0.3) == (
            "val"
        )
    assert result.summary["val"]["rows"] == len(val_rows)
    assert result.summary["val"]["sha256"] == hashlib.sha256(val.read_bytes()).hexdigest()
    assert result.summary["rows"] + result.summary["val"]["rows"] == 48
    again = run("export_jsonl", *args, "--force")
    assert again.summary["sha256"] == result.summary["sha256"]
    assert again.summary["val"]["sha256"] == result.summary["val"]["sha256"]


def test_it_filters_by_episode_achievements_flags_and_reward(scripted_batch, tmp_path):
    episodes = list(scripted_batch.episodes.order_by("seed"))
    with_wood = [e for e in episodes if "collect_sapling" in e.achievements]
    assert with_wood and len(with_wood) < len(episodes)
    # One file exported again and again: --force replaces it each time.
    out = tmp_path / "rows.jsonl"

    def episode_ids(*args: str) -> set[int]:
        result = run("export_jsonl", "--output", str(out), "--force", *args)
        assert result.code == 0, result.stderr
        return {r["metadata"]["episode_id"] for r in read_rows(out)}

    assert episode_ids("--require-achievement", "collect_sapling") == {e.id for e in with_wood}
    assert episode_ids("--exclude-achievement", "collect_sapling") == {
        e.id for e in episodes if e not in with_wood
    }
    assert episode_ids("--min-unique", "1") == {e.id for e in episodes if e.achievement_count}
    top = max(e.total_reward for e in episodes)
    assert episode_ids("--min-reward", str(top)) == {
        e.id for e in episodes if e.total_reward >= top
    }
    Turn.objects.filter(episode=episodes[0], index__in=[2, 5]).update(flagged=True)
    run("export_jsonl", "--output", str(out), "--force", "--flagged", "only")
    assert [(r["metadata"]["turn"], r["metadata"]["flagged"]) for r in read_rows(out)] == [
        (2, True),
        (5, True),
    ]
    assert len(read_rows(out)) == 2
    run("export_jsonl", "--output", str(out), "--force", "--flagged", "exclude")
    assert len(read_rows(out)) == 88
    assert run("export_jsonl", "--output", str(out), "--force", "--include-assistant").code == 1
    args = ("export_jsonl", "--output", str(out), "--force", "--include-assistant", "--allow-empty")
    assert run(*args).summary["rows"] == 0


def test_it_exports_a_saved_dataset_with_its_filters(scripted_batch, tmp_path):
    from curation.export_options import ExportOptions
    from curation.services import dataset_create
    from rollouts.review.turn_selection import TurnSelection

    dataset = dataset_create(
        name="wood",
        filters=TurnSelection(require_achievements=("collect_sapling",)),
        options=ExportOptions(history_frames=1),
    )
    out = tmp_path / "rows.jsonl"
    result = run("export_jsonl", "--output", str(out), "--dataset", str(dataset.id))
    assert result.code == 0, result.stderr
    rows = read_rows(out)
    assert rows and all(r["metadata"]["episode_id"] for r in rows)
    assert len(rows[1]["messages"][1]["content"]) == 3  # text, one history frame, current
    clash = run("export_jsonl", "--output", str(out), "--dataset", str(dataset.id), "--batch", "1")
    assert clash.code == 2 and "--batch" in clash.stderr


def test_it_exports_openai_requests_as_sent(chat_server, tmp_path):
    chat_server.script(replies.tool_call("move_left", "do"), replies.text("thinking aloud"))
    record(
        policy="openai",
        model="test-vlm",
        base_url=chat_server.url,
        seeds=(5,),
        steps=3,
        history_frames=1,
        image_detail="low",
    )
    out = tmp_path / "rows.jsonl"
    assert run("export_jsonl", "--output", str(out)).code == 0
    rows = read_rows(out)
    sent = [r.body for r in chat_server.requests]
    assert len(rows) == len(sent) >= 2
    for row, body in zip(rows, sent, strict=False):
        # What the model saw, byte for byte (images included), then what it answered.
        assert row["messages"][:-1] == body["messages"]
        assert row["metadata"]["model"] == "test-vlm"
        assert row["metadata"]["policy"] == "openai"
    first, second = rows[0]["messages"][-1], rows[1]["messages"][-1]
    assert first["tool_calls"][0]["function"]["arguments"] == json.dumps(
        {"actions": ["move_left", "do"]}
    )
    assert second["content"] == "thinking aloud"


# --- provider validation (--format openai) ---------------------------------------------------


def test_it_writes_openai_rows_without_metadata_and_they_pass(scripted_batch, tmp_path):
    out = tmp_path / "openai.jsonl"
    result = run("export_jsonl", "--output", str(out), "--format", "openai")
    assert result.code == 0, result.stderr
    rows = read_rows(out)
    assert len(rows) == 90 and all(list(r) == ["messages", "tools"] for r in rows)
    report = validate_openai_file(out)
    assert report.ok and report.rows == 90 and report.images == 90
    assert result.summary["estimated_tokens"] == report.tokens > 90 * 255


def test_it_writes_synth_rows_that_synth_ais_own_loader_accepts(scripted_batch, tmp_path):
    from curation.tests.reference import synth_ai_sft_data as synth_sft

    studio_out, synth_out = tmp_path / "studio.jsonl", tmp_path / "synth.jsonl"
    assert run("export_jsonl", "--output", str(studio_out)).code == 0
    result = run("export_jsonl", "--output", str(synth_out), "--format", "synth")
    assert result.code == 0, result.stderr
    studio_rows, synth_rows = read_rows(studio_out), read_rows(synth_out)
    assert len(synth_rows) == len(studio_rows) == 90
    # The same rows and messages; only the tools change shape (docs/formats.md).
    for studio_row, synth_row in zip(studio_rows, synth_rows, strict=True):
        assert synth_row["messages"] == studio_row["messages"]
        assert synth_row["metadata"] == studio_row["metadata"]
        assert synth_row["tools"] == [INTERACT_MANY_TOOL["function"]]
    synth_sft.validate_jsonl_or_raise(synth_out, min_messages=2)
    examples = synth_sft.load_jsonl(synth_out)
    assert len(examples) == 90 and examples[0].tools[0].name == "interact_many"
    # The studio format's nested tools are what that loader refuses.
    with pytest.raises(ValueError, match="tool 0 missing name"):
        synth_sft.validate_jsonl_or_raise(studio_out)


def test_it_refuses_too_few_rows_and_writes_nothing(scripted_batch, tmp_path):
    Turn.objects.filter(index__lt=3, episode__seed=1).update(flagged=True)
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "openai.jsonl"
    result = run("export_jsonl", "--output", str(out), "--format", "openai", "--flagged", "only")
    assert result.code == 1
    assert "train file: 3 rows; at least 10 are needed" in result.stderr
    assert not out.exists() and list(out.parent.iterdir()) == []


def test_it_refuses_more_than_ten_images_per_row_listing_every_row(scripted_batch, tmp_path):
    out = tmp_path / "openai.jsonl"
    result = run(
        "export_jsonl", "--output", str(out), "--format", "openai", "--history-frames", "9"
    )
    assert result.code == 0  # 9 history frames + the current one: 10, the limit
    bad = tmp_path / "bad.jsonl"
    rows = read_rows(out)
    rows[20]["messages"][1]["content"].append(rows[20]["messages"][1]["content"][-1])
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = validate_openai_file(bad)
    assert [str(v) for v in report.violations] == ["train row 21: 11 images; at most 10"]


# --- bad input: one line, exit status 2, nothing written --------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--require-achievement", "collect_woood"], "unknown achievement 'collect_woood'"),
        (["--exclude-achievement", "eat_cows"], "valid: " + ", ".join(ACHIEVEMENTS)),
        (["--batch", "999999"], "there is no batch 999999"),
        (["--model", "nope"], "no batch was played by 'nope'"),
        (["--history-frames", "12"], "history-frames: 12 is not between 0 and 9"),
        (["--val-output", "/tmp/x.jsonl"], "--val-output needs --val-fraction"),
        (["--val-fraction", "1.5"], "val-fraction: 1.5 is not in [0, 1)"),
        (["--dataset", "424242"], "there is no dataset 424242"),
        (["--flagged", "maybe"], "invalid choice: 'maybe'"),
        (["--min-unique", "many"], "invalid int value: 'many'"),
    ],
)
def test_it_rejects_bad_input_with_one_line_and_exit_2(db, tmp_path, args, message):
    out = tmp_path / "rows.jsonl"
    done = manage("export_jsonl", "--output", str(out), *args, env=subprocess_env())
    assert done.returncode == 2
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert done.stdout == "" and not out.exists()


def test_it_rejects_an_output_in_a_missing_directory(db, tmp_path):
    done = manage(
        "export_jsonl", "--output", str(tmp_path / "no" / "x.jsonl"), env=subprocess_env()
    )
    assert done.returncode == 2 and "does not exist" in done.stderr


def test_it_leaves_the_target_untouched_when_refused(scripted_batch, tmp_path):
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "rows.jsonl"
    out.write_text("previous export\n")
    result = run(
        "export_jsonl",
        "--output",
        str(out),
        "--force",
        "--format",
        "openai",
        "--min-reward",
        "1000",
    )
    assert result.code == 1
    assert out.read_text() == "previous export\n"
    assert sorted(p.name for p in Path(out.parent).iterdir()) == ["rows.jsonl"]
