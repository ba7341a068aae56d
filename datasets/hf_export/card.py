"""The dataset card: `README.md` with the Hub's `dataset_info` and `configs` blocks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datasets.hf_export.writing import SplitResult


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
    title = card.get("title") or "Crafter VLM Studio export"
    columns = "`prompt`, `chosen`, `rejected`" if kind == "preference" else "`prompt`, `completion`"
    lines = [
        "---",
        "dataset_info: " + json.dumps(info, ensure_ascii=False),
        "configs: " + json.dumps(configs),
        "tags: " + json.dumps(["crafter", "vision-language", "trl", kind]),
        "---",
        f"# {title}",
        "",
        "Crafter games played by vision-language-model agents, exported by the Crafter VLM "
        "Dataset Studio.",
        "",
        f"- Kind: {'preference pairs (DPO)' if kind == 'preference' else 'SFT, one row per turn'}",
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
            lines.append(f"- {key.replace('_', ' ').capitalize()}: `{json.dumps(card[key])}`")
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
