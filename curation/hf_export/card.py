"""The dataset card: `README.md` with the Hub's `dataset_info` and `configs` blocks."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from curation.hf_export.splits import SplitResult


def _yaml_feature(name: str, feature: Any) -> dict[str, Any]:
    """The card's `dataset_info.features` entry (the Hub's YAML form of a feature)."""
    return {"name": name, **_yaml_type(feature)}


def _yaml_type(feature: Any) -> dict[str, Any]:
    kind = feature.get("_type") if isinstance(feature, dict) else None
    if kind == "Value":
        return {"dtype": feature["dtype"]}
    if kind == "Image":
        return {"dtype": "image"}
    if kind == "List":
        inner = _yaml_type(feature["feature"])
        return {"list": inner.get("dtype") or inner.get("struct")}
    return {"struct": [_yaml_feature(n, f) for n, f in feature.items()]}


# Any run of whitespace or control characters, line and paragraph separators included.
_BREAKS = re.compile(r"[\s\x00-\x1f\x7f-\x9f\u2028\u2029]+")
# ASCII punctuation markdown may read as syntax; a backslash makes any of it literal.
_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|~=])")
_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def _yaml_value(value: Any) -> str:
    """A front matter value as ASCII JSON: YAML reads it as one flow value, and no text in
    it (a newline, a Unicode line separator, a `---`) can end it or start another key."""
    return json.dumps(value, ensure_ascii=True)


def _markdown_text(text: str) -> str:
    """Names (a dataset's, in the title) as plain text on one line: no new line, heading,
    link, emphasis or HTML can come of them."""
    line = _BREAKS.sub(" ", text).strip()
    line = "".join(_HTML.get(c, c) for c in line)
    return _MARKDOWN.sub(r"\\\1", line)


def _markdown_json(value: Any) -> str:
    """JSON as an inline code span that nothing inside can close: backticks and the HTML
    characters are written as JSON's own \\u escapes (the same value to a JSON reader)."""
    text = json.dumps(value, ensure_ascii=True)
    for char in "`<>&":
        text = text.replace(char, f"\\u{ord(char):04x}")
    return f"`{text}`"


_KIND_WORDS = {
    "preference": "preference pairs (DPO)",
    "probe": "vision checkpoints: one multiple-choice question on a frame a row, its right "
    "answer (from the game's state) as the completion",
}


def write_card(
    root: Path,
    features: dict[str, Any],
    results: dict[str, SplitResult],
    digest: str,
    card: dict[str, Any],
    kind: str,
) -> None:
    # YAML is a superset of JSON: the front matter is written as JSON, one key per line.
    info = {
        "features": [_yaml_feature(n, f) for n, f in features.items()],
        "splits": [
            {"name": n, "num_bytes": r.bytes, "num_examples": r.rows} for n, r in results.items()
        ],
    }
    configs = [
        {
            "config_name": "default",
            "data_files": [{"split": n, "path": f"data/{n}-*"} for n in results],
        }
    ]
    title = _markdown_text(str(card.get("title") or "")) or "Crafter VLM Studio export"
    columns = "`prompt`, `chosen`, `rejected`" if kind == "preference" else "`prompt`, `completion`"
    lines = [
        "---",
        "dataset_info: " + _yaml_value(info),
        "configs: " + _yaml_value(configs),
        "tags: " + _yaml_value(["crafter", "vision-language", "trl", kind]),
        "---",
        f"# {title}",
        "",
        "Crafter games played by vision-language-model agents, exported by the Crafter VLM "
        "Dataset Studio.",
        "",
        f"- Kind: {_KIND_WORDS.get(kind, 'SFT, one row per turn')}",
        f"- Columns: `images` (PNG frames, embedded), {columns} (chat messages with one "
        '`{"type": "image"}` placeholder per image), `tools` (JSON text) and metadata.',
    ]
    for name, result in results.items():
        lines.append(
            f"- Split `{name}`: {result.rows} rows, {result.episodes or 'n/a'} episodes, "
            f"{result.images} images, {result.shards} shard(s)"
        )
    for key in ("filter", "export_options", "batches", "models", "source"):
        if key in card:
            lines.append(f"- {key.replace('_', ' ').capitalize()}: {_markdown_json(card[key])}")
    lines += [
        f"- Export sha256: `{digest}` (sha256 of `sha256sum`-style lines of every file but "
        "this card, sorted by path)",
        "",
        "```python",
        "import datasets",
        'ds = datasets.load_dataset("parquet", data_dir="THIS_DIRECTORY")',
        'ds = datasets.load_from_disk("THIS_DIRECTORY")  # the same rows',
        "```",
        "",
    ]
    (root / "README.md").write_text("\n".join(lines), encoding="utf-8")
