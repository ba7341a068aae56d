"""Hostile import lines, each through the command: a line error, nothing written, no crash."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tracemalloc
from pathlib import Path

import pytest
from PIL import Image

from curation.models import Dataset
from curation.tests.conftest import read_rows, run
from rollouts.models import Episode, Frame, RolloutBatch, Turn
from rollouts.recording.frame_store import frame_name

pytestmark = pytest.mark.django_db


def png_url(color: tuple[int, int, int] = (0, 0, 0)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), color).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def good_row(text: str = "observation", url: str | None = None, **metadata) -> str:
    content: list[dict] = [{"type": "text", "text": text}]
    if url:
        content.append({"type": "image_url", "image_url": {"url": url}})
    row = {
        "messages": [{"role": "user", "content": content}, {"role": "assistant", "content": "a"}],
        "metadata": metadata,
    }
    return json.dumps(row)


def raw_metadata(fragment: str) -> str:
    """A good row whose metadata is the raw JSON text `{fragment}`."""
    return good_row()[: -len("{}}")] + "{" + fragment + "}}"


# Each line as a hostile writer would send it (raw JSON text: some are not what json.dumps
# writes), and a piece of the error that must name it.
HOSTILE_LINES: dict[str, tuple[str, str]] = {
    "nested 200,000 deep": (
        '{"messages": ' + "[" * 200_000 + "]" * 200_000 + "}",
        "nested deeper than",
    ),
    "nested 100 deep in metadata": (
        raw_metadata('"x": ' + "[" * 100 + "]" * 100),
        "nested deeper than",
    ),
    "turn 10**30": (raw_metadata('"turn": ' + str(10**30)), "out of range"),
    "turn 2**31": (good_row(turn=2**31), "metadata.turn must be a whole number"),
    "turn -1": (good_row(turn=-1), "metadata.turn must be a whole number"),
    "image index in image_url": (
        good_row(url=png_url()).replace('"url"', '"image": 7, "url"'),
        "only url and detail are allowed",
    ),
    "frame_step in image_url": (
        good_row(url=png_url()).replace('"url"', '"frame_step": 3, "url"'),
        "'frame_step'",
    ),
    "NUL in text": (good_row("a\u0000b"), "NUL character"),
    "lone surrogate in text": (good_row().replace("observation", "obs\\ud800"), "lone surrogate"),
    "lone surrogate in a key": (raw_metadata('"k\\udc00": 1'), "lone surrogate"),
    "NaN reward": (raw_metadata('"reward": NaN'), "NaN is not a number JSON allows"),
    "1e999 reward": (raw_metadata('"reward": 1e999'), "out of range"),
    "-Infinity anywhere": (raw_metadata('"x": -Infinity'), "-Infinity is not a number"),
    "unknown detail": (
        good_row(url=png_url()).replace('"url"', '"detail": "ultra", "url"'),
        "image_url.detail must be one of",
    ),
    "model name of 10,000 characters": (good_row(model="m" * 10_000), "metadata.model"),
}


def _counts() -> tuple[int, ...]:
    return tuple(m.objects.count() for m in (RolloutBatch, Episode, Frame, Turn, Dataset))


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text(
        "".join(line + "\n" for line in lines), encoding="utf-8", errors="surrogatepass"
    )
    return path


@pytest.mark.parametrize("case", list(HOSTILE_LINES))
def test_it_refuses_each_hostile_line_with_its_line_number(case, tmp_path, settings):
    line, expected = HOSTILE_LINES[case]
    before = _counts()
    path = _write(tmp_path / "hostile.jsonl", [good_row(url=png_url((9, 9, 9))), line])
    result = run("import_jsonl", str(path))
    assert result.code == 1, result.stderr
    first, *_ = result.stderr.splitlines()
    assert first.startswith("import_jsonl: error: line 2: ") and expected in first, first
    assert "Traceback" not in result.stderr and len(first) < 400
    assert "1 error(s) in the file, nothing imported" in result.stderr
    assert _counts() == before
    assert not (Path(settings.MEDIA_ROOT) / "frames").exists()


def test_it_reports_every_hostile_line_of_one_file(tmp_path):
    lines = [good_row()] + [line for line, _ in HOSTILE_LINES.values()]
    result = run("import_jsonl", str(_write(tmp_path / "all.jsonl", lines)))
    assert result.code == 1
    errors = result.stderr.splitlines()
    assert [e.removeprefix("import_jsonl: error: ").split(":", 1)[0] for e in errors[:-1]] == [
        f"line {n}" for n in range(2, len(lines) + 1)
    ]
    for error, (_, expected) in zip(errors, HOSTILE_LINES.values(), strict=False):
        assert expected in error


def test_it_refuses_an_over_long_line_while_reading_it(tmp_path, settings):
    """A 24 MB line without a newline, limit 1 MB: refused having held about 1 MB, not 24."""
    settings.STUDIO_IMPORT_MAX_LINE_BYTES = 1024 * 1024
    path = tmp_path / "long.jsonl"
    with open(path, "wb") as fh:
        fh.write((good_row() + "\n").encode())
        fh.write(b'{"messages": "' + b"x" * (24 * 1024 * 1024))
    tracemalloc.start()
    try:
        result = run("import_jsonl", str(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.code == 1
    assert (
        result.stderr.splitlines()[0]
        == "import_jsonl: error: line 2: line longer than 1048576 bytes"
    )
    assert peak < 4 * 1024 * 1024, peak


def test_it_refuses_a_file_whose_turns_are_already_here_or_skips_them(scripted_batch, tmp_path):
    export = tmp_path / "export.jsonl"
    assert run("export_jsonl", "--output", str(export), "--batch", str(scripted_batch.id)).code == 0
    before = _counts()
    refused = run("import_jsonl", str(export))
    assert refused.code == 1
    first_episode = scripted_batch.episodes.order_by("seed").first()
    assert refused.stderr.splitlines()[0] == (
        f"import_jsonl: error: line 1: turn 0 of episode {first_episode.id} "
        f"(batch {scripted_batch.id}) is already in the studio"
    )
    assert _counts() == before
    # One new row beside the 90 known ones: with the flag, only it is imported.
    rows = read_rows(export)
    changed = json.loads(json.dumps(rows[5]))
    changed["messages"][-1]["content"] = "a different answer"
    _write(export, [json.dumps(r) for r in rows] + [json.dumps(changed)])
    skipped = run("import_jsonl", str(export), "--skip-existing")
    assert skipped.code == 0, skipped.stderr
    assert skipped.summary["turns"] == 1 and skipped.summary["skipped"] == 90
    (turn,) = Turn.objects.filter(episode__batch_id=skipped.summary["batch_id"])
    assert turn.model_text == "a different answer"
    # Everything known: nothing to import, said in one line.
    _write(export, [json.dumps(r) for r in rows])
    again = run("import_jsonl", str(export), "--skip-existing")
    assert again.code == 1 and "all 90 lines are turns already in the studio" in again.stderr


def test_it_leaves_no_frame_file_behind_when_storage_fails_midway(tmp_path, settings):
    """The first image is stored, the second cannot be (its directory is taken by a file):
    the import fails as one line and the first PNG is removed again."""
    urls = [png_url((n, 0, 0)) for n in range(40)]
    shas = [hashlib.sha256(base64.b64decode(u.split(",", 1)[1])).hexdigest() for u in urls]
    first = 0
    second = next(n for n in range(1, 40) if shas[n][:2] != shas[first][:2])
    media = Path(settings.MEDIA_ROOT)
    (media / "frames").mkdir(parents=True)
    (media / "frames" / shas[second][:2]).write_bytes(b"in the way")
    path = _write(tmp_path / "two.jsonl", [good_row(url=urls[first]), good_row(url=urls[second])])
    before = _counts()
    result = run("import_jsonl", str(path))
    assert result.code == 1
    assert result.stderr.startswith("import_jsonl: error: storage refused a frame: "), result.stderr
    assert "Traceback" not in result.stderr
    assert _counts() == before
    assert not (media / frame_name(shas[first])).exists()
    assert list(media.rglob("*.png")) == []


def test_what_passes_the_check_exports_back_as_it_came(tmp_path):
    """The edge of what is accepted: every accepted value survives the export unchanged."""
    row = {
        "messages": [
            {"role": "system", "content": "s", "name": "rules"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": 'emoji \U0001f600, tab\t, quote " and \\\\'},
                    {
                        "type": "image_url",
                        "image_url": {"url": png_url((1, 2, 3)), "detail": "low"},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c" * 200,
                        "type": "function",
                        "function": {"name": "interact_many", "arguments": '{"actions": ["do"]}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c", "content": "ok"},
            {"role": "assistant", "content": "deep " + "x" * 10_000},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"n": 2**62}}}],
        "metadata": {"turn": 2**31 - 1, "reward": 1e308, "flagged": True, "model": "m" * 200},
    }
    source = tmp_path / "edge.jsonl"
    source.write_text(json.dumps(row, ensure_ascii=False) + "\n", encoding="utf-8")
    imported = run("import_jsonl", str(source))
    assert imported.code == 0, imported.stderr
    out = tmp_path / "out.jsonl"
    batch_id = str(imported.summary["batch_id"])
    assert run("export_jsonl", "--output", str(out), "--batch", batch_id).code == 0
    (exported,) = read_rows(out)
    assert exported["messages"] == row["messages"]
    assert exported["tools"] == row["tools"]
    meta = exported["metadata"]
    assert (meta["turn"], meta["reward"], meta["flagged"]) == (2**31 - 1, 1e308, True)
    assert meta["model"] == "m" * 200


def test_it_refuses_the_same_file_twice_whatever_its_format(tmp_path):
    """Rows from elsewhere carry no ids of ours: the file itself is recognised."""
    path = tmp_path / "chat.jsonl"
    path.write_text(good_row("one") + "\n" + good_row("two") + "\n", encoding="utf-8")
    first = run("import_jsonl", str(path))
    assert first.code == 0, first.stderr
    before = _counts()
    again = run("import_jsonl", str(path))
    assert again.code == 1
    assert again.stderr.splitlines()[0] == (
        "import_jsonl: error: this file was imported already "
        f"(batch {first.summary['batch_id']}); import with --skip-existing "
        "(or tick 'Skip turns already here') to leave known turns out"
    )
    skipped = run("import_jsonl", str(path), "--skip-existing")
    assert skipped.code == 1 and "all 2 lines are turns already in the studio" in skipped.stderr
    assert _counts() == before
