"""A dataset version's `export_hf` directory as the rows TRL's SFTTrainer trains on.

The export (docs/formats.md, "export_hf") has `images`, `prompt` and `completion` chat
messages with `{"type": "image"}` placeholders, `tools` as JSON text and metadata columns.
Two things would be lost on the way through TRL's vision collator, which renders each row
with the processor's chat template but passes it no `tools`:

- the tool block: rendered here into each row's system turn, as the exact text the model's
  own chat template writes for those tools (found by rendering the template with and
  without them), so the model trains on the same prompt a server sends it;
- structured `tool_calls`: Qwen-style templates drop them, so every call becomes the text
  `<tool_call>{"name": ..., "arguments": ...}</tool_call>` that `export_hf
  --tool-calls-as-text` writes (the same function writes both).

Each row's image placeholders must match its images (TRL pairs them by position), checked
without decoding an image. Only `images`, `prompt` and `completion` reach the trainer.
Imports `datasets` lazily.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from curation.hf_export.rows import _tool_call_text

# What a tools column may hold before it is refused: the studio's own is a few kilobytes.
MAX_TOOLS_CHARS = 64 * 1024
MAX_TOOLS = 64
_SENTINEL = "\u27e6studio-system-text\u27e7"
SPLITS = ("train", "validation")


class RowsError(ValueError):
    """The export cannot be trained on; the message is one line naming what and where."""


def load_splits(dataset_dir: Path, *, cache_dir: Path) -> dict[str, Any]:
    """The export's splits by name ("train", and "validation" when it has one).

    `load_from_disk` maps the Arrow shards in place; an export with only the parquet layout
    is read with the parquet builder into `cache_dir`, never into a shared cache.
    """
    import datasets  # the train extra

    dataset_dir = Path(dataset_dir)
    if (dataset_dir / "dataset_dict.json").is_file():
        loaded = datasets.load_from_disk(str(dataset_dir))
    elif any((dataset_dir / "data").glob("*.parquet")):
        loaded = datasets.load_dataset(
            "parquet", data_dir=str(dataset_dir), cache_dir=str(cache_dir)
        )
    else:
        raise RowsError(f"{dataset_dir.name}: not an export_hf directory (no dataset_dict.json)")
    found = {name: loaded[name] for name in SPLITS if name in loaded}
    if "train" not in found:
        raise RowsError(f"{dataset_dir.name}: the export has no train split")
    missing = {"images", "prompt", "completion", "tools"} - set(found["train"].column_names)
    if missing:
        raise RowsError(f"{dataset_dir.name}: the export lacks the columns {sorted(missing)}")
    return found


def tools_block(processor: Any, tools: list[dict[str, Any]]) -> str:
    """The text the processor's chat template appends to the system turn for `tools`.

    Rendered once with and once without the tools around a sentinel system text: what
    appears right after the sentinel is the block. A template that puts tools anywhere else
    is refused (a row would train on a prompt no server sends).
    """
    if not tools:
        return ""
    conversation = [
        {"role": "system", "content": [{"type": "text", "text": _SENTINEL}]},
        {"role": "user", "content": [{"type": "text", "text": "."}]},
    ]
    without = processor.apply_chat_template(conversation, tokenize=False)
    with_tools = processor.apply_chat_template(conversation, tools=tools, tokenize=False)
    at = without.find(_SENTINEL)
    cut = at + len(_SENTINEL)
    after = without[cut:]
    if at < 0 or with_tools[:cut] != without[:cut] or not with_tools.endswith(after):
        raise RowsError("the chat template does not render tools right after the system text")
    return with_tools[cut : len(with_tools) - len(after)]


def _tools_of(text: Any, where: str) -> list[dict[str, Any]]:
    if text is None or text == "":
        return []
    if not isinstance(text, str) or len(text) > MAX_TOOLS_CHARS:
        raise RowsError(f"{where}: tools is not JSON text of at most {MAX_TOOLS_CHARS} characters")
    try:
        tools = json.loads(text)
    except ValueError as exc:
        raise RowsError(f"{where}: tools is not JSON ({exc.msg})") from None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise RowsError(f"{where}: tools is not a list of at most {MAX_TOOLS} tools")
    if not all(isinstance(tool, dict) for tool in tools):
        raise RowsError(f"{where}: a tool is not an object")
    return tools


def _parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    parts = []
    for part in content or []:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "image":
            parts.append({"type": "image", "text": None})
        elif kind == "text":
            parts.append({"type": "text", "text": str(part.get("text") or "")})
    return parts


def message_with_text_calls(message: dict[str, Any]) -> dict[str, Any]:
    """The message with its structured tool calls written as `<tool_call>` text, joined to
    its text as `export_hf --tool-calls-as-text` joins them."""
    parts = _parts(message.get("content"))
    calls = [c for c in message.get("tool_calls") or [] if isinstance(c, dict)]
    if calls:
        text = "\n".join(_tool_call_text(call) for call in calls)
        if parts and parts[-1]["type"] == "text":
            parts[-1] = {"type": "text", "text": parts[-1]["text"] + "\n" + text}
        else:
            parts.append({"type": "text", "text": text})
    return {"role": str(message.get("role") or ""), "content": parts, "tool_calls": None}


def prompt_with_tools(prompt: list[dict[str, Any]], block: str) -> list[dict[str, Any]]:
    """The prompt with the tool block appended to its system turn (a system turn holding
    only the block is added when there is none, as the template renders it)."""
    messages = [message_with_text_calls(m) for m in prompt]
    if not block:
        return messages
    if messages and messages[0]["role"] == "system":
        parts = messages[0]["content"]
        if parts and parts[-1]["type"] == "text":
            parts[-1] = {"type": "text", "text": parts[-1]["text"] + block}
        else:
            parts.append({"type": "text", "text": block})
        return messages
    system = {"role": "system", "content": [{"type": "text", "text": block}], "tool_calls": None}
    return [system, *messages]


class _RowRenderer:
    """Renders rows, computing each distinct tools text's block once."""

    def __init__(self, processor: Any, split: str) -> None:
        self.processor, self.split = processor, split
        self.blocks: dict[str, str] = {}

    def __call__(
        self, images: list, prompt: list, completion: list, tools: Any, index: int
    ) -> dict[str, Any]:
        where = f"{self.split} row {index}"
        key = tools if isinstance(tools, str) else json.dumps(tools)
        if key not in self.blocks:
            self.blocks[key] = tools_block(self.processor, _tools_of(tools, where))
        if not completion:
            raise RowsError(f"{where}: the completion is empty")
        placeholders = sum(
            1
            for m in [*(prompt or []), *completion]
            for p in _parts(m.get("content"))
            if p["type"] == "image"
        )
        # TRL pairs placeholders with images by position: a mismatch trains on the wrong frame.
        if placeholders != len(images or []):
            raise RowsError(
                f"{where}: {placeholders} image placeholders for {len(images or [])} images"
            )
        return {
            "prompt": prompt_with_tools(list(prompt or []), self.blocks[key]),
            "completion": [message_with_text_calls(m) for m in completion],
        }


def training_rows(dataset: Any, processor: Any, *, split: str, cache_file: Path) -> Any:
    """`dataset` (one split of the export) as `images`, `prompt`, `completion` rows with the
    tool block in the system turn and tool calls as text. Images pass through untouched."""
    from datasets import Image, List  # the train extra

    cache_file.parent.mkdir(parents=True, exist_ok=True)
    # Counted, not decoded: the images stay the export's PNG bytes until the collator. The
    # cast writes its table into the run's own folder: left to itself `datasets` would write it
    # beside the export's shards, in the checked (and size-bounded) model cache.
    features = dataset.features.copy()
    features["images"] = List(Image(decode=False))
    undecoded = dataset.cast(
        features,
        cache_file_name=str(cache_file.with_name(f"{cache_file.stem}-undecoded.arrow")),
        load_from_cache_file=False,
    )
    rendered = undecoded.map(
        _RowRenderer(processor, split),
        input_columns=["images", "prompt", "completion", "tools"],
        with_indices=True,
        cache_file_name=str(cache_file),
        load_from_cache_file=False,
        desc=None,
    )
    extra = [c for c in rendered.column_names if c not in ("images", "prompt", "completion")]
    return rendered.remove_columns(extra).cast_column("images", List(Image()))
