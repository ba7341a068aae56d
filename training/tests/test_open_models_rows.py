"""An export's rows as the trainer sees them: the tool block in the system turn, calls as text.

The export is written by curation's own writer from rows a real export produced (the golden
JSONL of curation's tests); the model is the tiny Qwen2-VL with its real processor.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from curation.hf_export import write_hf_dataset
from training.open_models.rows import RowsError, load_splits, tools_block, training_rows
from training.open_models.tiny import build_tiny_vlm

GOLDEN = Path(__file__).resolve().parents[2] / "curation" / "tests" / "golden"
# The tiny template's tool block, written out by hand from what it promises (Qwen2.5's shape).
HEAD = "\n\n# Tools\n\n<tools>"
TAIL = (
    '\n</tools>\n\nCall a tool as <tool_call>{"name": <name>, "arguments": <arguments>}</tool_call>'
)


def golden_rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (GOLDEN / name).read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def processor(tmp_path_factory):
    from transformers import AutoProcessor

    directory = build_tiny_vlm(tmp_path_factory.mktemp("tiny") / "model")
    return AutoProcessor.from_pretrained(directory, local_files_only=True)


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("export")
    sources = {"train": GOLDEN / "studio_split.jsonl", "val": GOLDEN / "studio_split.val.jsonl"}
    write_hf_dataset(sources=sources, output=root / "hf", kind="sft")
    return root / "hf"


def rendered(dataset, processor, tmp_path, split="train"):
    return training_rows(dataset, processor, split=split, cache_file=tmp_path / f"{split}.arrow")


def as_trl_renders(row: dict, processor) -> dict:
    """The prompt and completion text exactly as TRL's vision collator makes them."""
    from trl.data_utils import apply_chat_template, prepare_multimodal_messages

    example = {
        "prompt": prepare_multimodal_messages(row["prompt"], images=row["images"]),
        "completion": prepare_multimodal_messages(row["completion"]),
    }
    return apply_chat_template(example, processor)


def test_a_row_trains_on_the_tool_block_once_and_its_call_as_text(processor, export, tmp_path):
    splits = load_splits(export, cache_dir=tmp_path / "cache")
    assert set(splits) == {"train", "validation"}
    rows = rendered(splits["train"], processor, tmp_path)
    assert rows.column_names == ["images", "prompt", "completion"]
    assert len(rows) == 11
    tools = golden_rows("studio_split.jsonl")[0]["tools"]
    block = HEAD + "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
    block += TAIL
    text = as_trl_renders(rows[0], processor)
    assert text["prompt"].count(block) == 1 and text["prompt"].count("<tools>") == 1
    assert text["prompt"].endswith("<|im_start|>assistant\n")
    # The scripted policy's first action in the golden export: noop.
    assert text["completion"] == (
        '<tool_call>{"name": "interact_many", "arguments": {"actions": ["noop"]}}</tool_call>'
        "<|im_end|>\n"
    )
    assert tools_block(processor, tools) == block


def test_the_prompt_is_what_the_template_renders_with_the_rows_tools(processor, export, tmp_path):
    """Training and serving agree: a server renders the same prompt from the same tools."""
    splits = load_splits(export, cache_dir=tmp_path / "cache")
    raw = splits["validation"]
    rows = rendered(raw, processor, tmp_path, split="validation")
    for index in range(len(rows)):
        served = processor.apply_chat_template(
            raw[index]["prompt"],
            tools=json.loads(raw[index]["tools"]),
            add_generation_prompt=True,
            tokenize=False,
        )
        assert as_trl_renders(rows[index], processor)["prompt"] == served


def test_a_text_and_its_call_join_as_export_hf_tool_calls_as_text_writes_them(processor, tmp_path):
    structured, as_text = tmp_path / "structured", tmp_path / "as-text"
    source = {"train": GOLDEN / "recorded_only.jsonl"}
    write_hf_dataset(sources=source, output=structured, kind="sft")
    write_hf_dataset(sources=source, output=as_text, kind="sft", tool_calls_as_text=True)
    ours = rendered(load_splits(structured, cache_dir=tmp_path / "c")["train"], processor, tmp_path)
    theirs = load_splits(as_text, cache_dir=tmp_path / "c")["train"]
    assert [r["completion"][0]["content"] for r in ours] == [
        r["completion"][0]["content"] for r in theirs
    ]
    assert ours[0]["completion"][0]["content"] == [
        {
            "type": "text",
            "text": 'Step 0: up.\n<tool_call>{"name": "interact_many", "arguments": '
            '{"actions": ["move_up"]}}</tool_call>',
        }
    ]
    assert all(m["tool_calls"] is None for r in ours for m in r["prompt"] + r["completion"])


def test_the_parquet_layout_alone_loads_the_same_rows(processor, export, tmp_path):
    parquet_only = tmp_path / "parquet-only"
    shutil.copytree(export / "data", parquet_only / "data")
    one = load_splits(parquet_only, cache_dir=tmp_path / "cache")
    two = load_splits(export, cache_dir=tmp_path / "cache")
    assert {k: v.num_rows for k, v in one.items()} == {"train": 11, "validation": 6}
    assert one["train"]["prompt"] == two["train"]["prompt"]


def test_hostile_tools_and_directories_are_refused_with_one_line(processor, export, tmp_path):
    train = load_splits(export, cache_dir=tmp_path / "cache")["train"]
    broken = train.map(lambda row: {"tools": "{not json"}, keep_in_memory=True)
    with pytest.raises(RowsError, match=r"^train row 0: tools is not JSON \(") as caught:
        rendered(broken, processor, tmp_path)
    assert "\n" not in str(caught.value)
    huge = train.map(lambda row: {"tools": json.dumps([{}] * 100)}, keep_in_memory=True)
    with pytest.raises(RowsError, match=r"^train row 0: tools is not a list of at most 64 tools$"):
        rendered(huge, processor, tmp_path)
    unpaired = train.map(lambda row: {"images": row["images"][:-1]}, keep_in_memory=True)
    with pytest.raises(RowsError, match=r"^train row 0: 1 image placeholders for 0 images$"):
        rendered(unpaired, processor, tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(RowsError, match=r"^empty: not an export_hf directory"):
        load_splits(tmp_path / "empty", cache_dir=tmp_path / "cache")


def test_a_template_that_puts_tools_elsewhere_is_refused(processor):
    from transformers import AutoProcessor

    odd = AutoProcessor.from_pretrained(processor.tokenizer.name_or_path, local_files_only=True)
    odd.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {% for p in m['content'] %}{{ p['text'] }}"
        "{% endfor %}\n{% endfor %}{% if tools %}tools: {{ tools | tojson }}{% endif %}"
    )
    with pytest.raises(RowsError, match="does not render tools right after the system text"):
        tools_block(odd, [{"type": "function", "function": {"name": "f"}}])
