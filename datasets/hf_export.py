"""Hugging Face `datasets` output: parquet shards, Arrow shards and a dataset card. No Django.

The input is this studio's own JSONL (SFT rows of SPEC section 5, or the preference rows of
`datasets.preferences`), read one line at a time; the output loads offline both with
`datasets.load_dataset("parquet", data_dir=DIR)` and `datasets.load_from_disk(DIR)`:

    DIR/README.md                                  dataset card (YAML `dataset_info`, `configs`)
    DIR/data/{split}-00000-of-0000N.parquet        the Hub's layout, images embedded as bytes
    DIR/dataset_dict.json                          `load_from_disk`'s layout:
    DIR/{split}/data-00000-of-0000N.arrow            Arrow stream shards,
    DIR/{split}/dataset_info.json, state.json        their features and state

Columns follow TRL's vision formats: `images` (a list of Image, the stored PNG bytes) and chat
messages whose image parts are `{"type": "image"}` placeholders, one per image, in order:
`prompt` and `completion` for SFT rows, `prompt`, `chosen` and `rejected` for preference rows;
`tools` is the tool schema as JSON text; metadata columns follow.

Our Django app is also called `datasets`, so the library is never imported here: the files are
written with pyarrow, with the feature metadata (`huggingface` schema key) the library writes.
Rows are buffered a row group at a time and shards are cut by size, so memory stays flat
whatever the size of the export. The same input gives the same bytes.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

SPLIT_NAMES = {"train": "train", "val": "validation"}
ROW_GROUP_ROWS = 256
ROW_GROUP_BYTES = 64 << 20
SHARD_BYTES = 256 << 20
_DATA_URL = "data:image/"


class HFExportError(ValueError):
    """A row cannot be written (an image that is not a data URL, an unknown part type)."""


# --- features: one declaration gives the Arrow schema and the `datasets` metadata ----------


def _value(dtype: str) -> dict[str, Any]:
    return {"dtype": dtype, "_type": "Value"}


def _list(feature: Any) -> dict[str, Any]:
    return {"feature": feature, "_type": "List"}


_PART = {"type": _value("string"), "text": _value("string")}
_TOOL_CALL = {
    "id": _value("string"),
    "type": _value("string"),
    "function": {"name": _value("string"), "arguments": _value("string")},
}
_MESSAGE = {"role": _value("string"), "content": _list(_PART), "tool_calls": _list(_TOOL_CALL)}
_MESSAGES = _list(_MESSAGE)
_IMAGES = _list({"_type": "Image"})

SFT_METADATA = {
    "episode_id": _value("int64"),
    "batch_id": _value("int64"),
    "seed": _value("int64"),
    "turn": _value("int64"),
    "model": _value("string"),
    "policy": _value("string"),
    "reward": _value("float64"),
    "new_achievements": _list(_value("string")),
    "cumulative_unique": _value("int64"),
    "flagged": _value("bool"),
}
_OUTCOME = {
    "episode_id": _value("int64"),
    "batch_id": _value("int64"),
    "sample": _value("int64"),
    "unique_achievements": _value("int64"),
    "reward": _value("float64"),
}
PREFERENCE_METADATA = {
    "seed": _value("int64"),
    "turn": _value("int64"),
    "chosen_episode": _OUTCOME,
    "rejected_episode": _OUTCOME,
}


def features_for(kind: str, *, with_metadata: bool) -> dict[str, Any]:
    if kind == "preference":
        columns = {"images": _IMAGES, "prompt": _MESSAGES, "chosen": _MESSAGES}
        columns["rejected"] = _MESSAGES
        metadata = PREFERENCE_METADATA
    else:
        columns = {"images": _IMAGES, "prompt": _MESSAGES, "completion": _MESSAGES}
        metadata = SFT_METADATA
    columns["tools"] = _value("string")
    if with_metadata:
        columns.update(metadata)
    return columns


def _arrow_type(feature: Any) -> pa.DataType:
    if isinstance(feature, dict) and feature.get("_type") == "Value":
        return {
            "string": pa.string(),
            "int64": pa.int64(),
            "float64": pa.float64(),
            "bool": pa.bool_(),
        }[feature["dtype"]]
    if isinstance(feature, dict) and feature.get("_type") == "List":
        return pa.list_(_arrow_type(feature["feature"]))
    if isinstance(feature, dict) and feature.get("_type") == "Image":
        return pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    return pa.struct([(name, _arrow_type(sub)) for name, sub in feature.items()])


def arrow_schema(features: dict[str, Any]) -> pa.Schema:
    metadata = {"huggingface": json.dumps({"info": {"features": features}})}
    return pa.schema([(n, _arrow_type(f)) for n, f in features.items()], metadata=metadata)


# --- rows ---------------------------------------------------------------------------------


def _image_bytes(url: Any) -> bytes:
    if not isinstance(url, str) or not url.startswith(_DATA_URL) or ";base64," not in url:
        raise HFExportError("an image part is not a base64 data URL")
    try:
        return base64.b64decode(url.split(",", 1)[1], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise HFExportError(f"an image data URL does not decode: {exc}") from exc


def _tool_call_text(call: dict[str, Any]) -> str:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        # Malformed arguments stay as the model wrote them: a string, never a repaired object.
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    body = json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>{body}</tool_call>"


def _message(message: dict[str, Any], images: list[bytes], *, tool_calls_as_text: bool) -> dict:
    content = message.get("content")
    parts: list[dict[str, Any]] = []
    if isinstance(content, str):
        parts.append({"type": "text", "text": content})
    elif isinstance(content, list):
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                parts.append({"type": "text", "text": str(part.get("text", ""))})
            elif kind == "image_url":
                images.append(_image_bytes((part.get("image_url") or {}).get("url")))
                parts.append({"type": "image", "text": None})
            elif kind == "image":
                parts.append({"type": "image", "text": None})  # images come in `images`
            else:
                raise HFExportError(f"message part of type {kind!r} has no column here")
    elif content is not None:
        raise HFExportError("message content is neither text nor a list of parts")
    calls = message.get("tool_calls") or []
    if calls and tool_calls_as_text:
        text = "\n".join(_tool_call_text(call) for call in calls)
        if parts and parts[-1]["type"] == "text":
            parts[-1] = {"type": "text", "text": parts[-1]["text"] + "\n" + text}
        else:
            parts.append({"type": "text", "text": text})
        calls = []
    return {
        "role": str(message.get("role", "")),
        "content": parts,
        "tool_calls": [
            {
                "id": call.get("id"),
                "type": call.get("type", "function"),
                "function": {
                    "name": (call.get("function") or {}).get("name"),
                    "arguments": _arguments_text((call.get("function") or {}).get("arguments")),
                },
            }
            for call in calls
        ]
        or None,
    }


def _arguments_text(arguments: Any) -> str | None:
    if arguments is None or isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False)


def _messages(messages: list, images: list[bytes], *, tool_calls_as_text: bool) -> list[dict]:
    return [_message(m, images, tool_calls_as_text=tool_calls_as_text) for m in messages]


def sft_columns(row: dict[str, Any], *, tool_calls_as_text: bool) -> dict[str, Any]:
    """One SFT row of SPEC section 5 as columns: the last message is the completion."""
    images: list[bytes] = []
    messages = row["messages"]
    out: dict[str, Any] = {
        "prompt": _messages(messages[:-1], images, tool_calls_as_text=tool_calls_as_text),
        "completion": _messages(messages[-1:], images, tool_calls_as_text=tool_calls_as_text),
    }
    meta = row.get("metadata")
    if isinstance(meta, dict):
        out.update(
            episode_id=meta.get("episode_id"),
            batch_id=meta.get("batch_id"),
            seed=meta.get("seed"),
            turn=meta.get("turn"),
            model=meta.get("model"),
            policy=meta.get("policy"),
            reward=meta.get("reward"),
            new_achievements=(meta.get("achievements") or {}).get("new_unique") or [],
            cumulative_unique=(meta.get("achievements") or {}).get("cumulative_unique"),
            flagged=meta.get("flagged"),
        )
    return _finish(out, row, images)


def preference_columns(row: dict[str, Any], *, tool_calls_as_text: bool) -> dict[str, Any]:
    """A preference row (`datasets.preferences`): placeholders in the prompt, `images` beside."""
    images = [_image_bytes(url) for url in row.get("images") or []]
    seen: list[bytes] = []
    out: dict[str, Any] = {
        "prompt": _messages(row["prompt"], seen, tool_calls_as_text=tool_calls_as_text),
        "chosen": _messages(row["chosen"], seen, tool_calls_as_text=tool_calls_as_text),
        "rejected": _messages(row["rejected"], seen, tool_calls_as_text=tool_calls_as_text),
    }
    if seen:
        raise HFExportError("preference rows carry their images in `images`, not in messages")
    meta = row.get("metadata")
    if isinstance(meta, dict):
        out.update(
            seed=meta.get("seed"),
            turn=meta.get("turn"),
            chosen_episode=meta.get("chosen"),
            rejected_episode=meta.get("rejected"),
        )
    return _finish(out, row, images)


def _finish(out: dict[str, Any], row: dict[str, Any], images: list[bytes]) -> dict[str, Any]:
    placeholders = sum(
        1
        for column in ("prompt", "completion", "chosen", "rejected")
        for message in out.get(column) or []
        for part in message["content"]
        if part["type"] == "image"
    )
    # TRL pairs placeholders with images by position: a mismatch would train on the wrong frame.
    if placeholders != len(images):
        raise HFExportError(f"{placeholders} image placeholders for {len(images)} images")
    out["images"] = [{"bytes": data, "path": None} for data in images]
    out["tools"] = json.dumps(row.get("tools") or [], ensure_ascii=False)
    return out


# --- files --------------------------------------------------------------------------------


@dataclass
class SplitResult:
    name: str
    rows: int = 0
    images: int = 0
    episodes: int = 0
    bytes: int = 0
    shards: int = 0
    parquet: list[str] = field(default_factory=list)
    arrow: list[str] = field(default_factory=list)
    _last_episode: Any = None


class _SplitWriter:
    """Writes one split's parquet and Arrow shards, a row group at a time."""

    def __init__(self, root: Path, split: str, schema: pa.Schema, shard_bytes: int) -> None:
        self.root, self.split, self.schema, self.shard_bytes = root, split, schema, shard_bytes
        self.result = SplitResult(split)
        self.buffer: list[dict[str, Any]] = []
        self.buffer_bytes = 0
        self.shard_written = 0
        self.parquet: pq.ParquetWriter | None = None
        self.arrow: pa.ipc.RecordBatchStreamWriter | None = None
        self.arrow_sink: Any = None
        (root / "data").mkdir(parents=True, exist_ok=True)
        (root / split).mkdir(parents=True, exist_ok=True)

    def add(self, columns: dict[str, Any], *, episode: Any) -> None:
        self.buffer.append(columns)
        self.buffer_bytes += sum(len(i["bytes"]) for i in columns["images"]) + 1024
        self.result.rows += 1
        self.result.images += len(columns["images"])
        if episode is not None and episode != self.result._last_episode:
            self.result.episodes += 1
            self.result._last_episode = episode
        room = min(ROW_GROUP_BYTES, self.shard_bytes - self.shard_written)
        if len(self.buffer) >= ROW_GROUP_ROWS or self.buffer_bytes >= room:
            self._flush()
            if self.shard_written >= self.shard_bytes:
                self._close_shard()

    def _flush(self) -> None:
        if not self.buffer:
            return
        if self.parquet is None:
            n = self.result.shards
            self.result.parquet.append(f"data/{self.split}.tmp-{n:05d}.parquet")
            self.result.arrow.append(f"{self.split}/data.tmp-{n:05d}.arrow")
            self.result.shards += 1
            self.parquet = pq.ParquetWriter(
                self.root / self.result.parquet[-1], self.schema, compression="snappy"
            )
            self.arrow_sink = pa.OSFile(str(self.root / self.result.arrow[-1]), "wb")
            self.arrow = pa.ipc.new_stream(self.arrow_sink, self.schema)
            self.shard_written = 0
        table = pa.Table.from_pylist(self.buffer, schema=self.schema)
        self.parquet.write_table(table, row_group_size=len(self.buffer))
        assert self.arrow is not None
        self.arrow.write_table(table)
        self.shard_written += self.buffer_bytes
        self.buffer, self.buffer_bytes = [], 0

    def _close_shard(self) -> None:
        if self.parquet is not None:
            self.parquet.close()
            self.arrow.close()
            self.arrow_sink.close()
            self.parquet = self.arrow = self.arrow_sink = None

    def close(self) -> SplitResult:
        self._flush()
        self._close_shard()
        if self.result.shards == 0:  # an empty split is still a split with its schema
            self.parquet = None
            self.buffer = []
            self.result.parquet.append(f"data/{self.split}.tmp-00000.parquet")
            self.result.arrow.append(f"{self.split}/data.tmp-00000.arrow")
            self.result.shards = 1
            empty = self.schema.empty_table()
            pq.write_table(empty, self.root / self.result.parquet[0], compression="snappy")
            with (
                pa.OSFile(str(self.root / self.result.arrow[0]), "wb") as sink,
                pa.ipc.new_stream(sink, self.schema) as writer,
            ):
                writer.write_table(empty)
        # Shards get their final names once their number is known (the Hub's convention).
        total = self.result.shards
        final_parquet, final_arrow = [], []
        for n, (pq_name, arrow_name) in enumerate(
            zip(self.result.parquet, self.result.arrow, strict=True)
        ):
            new_pq = f"data/{self.split}-{n:05d}-of-{total:05d}.parquet"
            new_arrow = f"{self.split}/data-{n:05d}-of-{total:05d}.arrow"
            os.replace(self.root / pq_name, self.root / new_pq)
            os.replace(self.root / arrow_name, self.root / new_arrow)
            final_parquet.append(new_pq)
            final_arrow.append(new_arrow)
        self.result.parquet, self.result.arrow = final_parquet, final_arrow
        self.result.bytes = sum((self.root / n).stat().st_size for n in final_parquet)
        return self.result

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self._close_shard()


@dataclass
class HFResult:
    path: str
    kind: str
    splits: dict[str, SplitResult]
    sha256: str
    files: list[str]

    def summary(self) -> dict[str, Any]:
        return {
            "rows": sum(s.rows for s in self.splits.values()),
            "episodes": sum(s.episodes for s in self.splits.values()),
            "images": sum(s.images for s in self.splits.values()),
            "path": self.path,
            "sha256": self.sha256,
            "kind": self.kind,
            "splits": {
                name: {
                    "rows": s.rows,
                    "episodes": s.episodes,
                    "images": s.images,
                    "shards": s.shards,
                }
                for name, s in self.splits.items()
            },
        }


def write_hf_dataset(
    *,
    sources: dict[str, Path],
    output: Path,
    kind: str,
    tool_calls_as_text: bool = False,
    card: dict[str, Any] | None = None,
    shard_bytes: int = SHARD_BYTES,
) -> HFResult:
    """JSONL files by split ("train", "val") -> a `datasets` dataset in `output` (a new dir).

    Written in a temporary directory beside `output` and moved into place when complete: a
    failed export leaves nothing behind.
    """
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-hf-", dir=output.parent))
    writers: list[_SplitWriter] = []
    try:
        first_rows = {split: _first_row(path) for split, path in sources.items()}
        with_metadata = any(isinstance(r, dict) and "metadata" in r for r in first_rows.values())
        features = features_for(kind, with_metadata=with_metadata)
        schema = arrow_schema(features)
        convert = preference_columns if kind == "preference" else sft_columns
        results: dict[str, SplitResult] = {}
        for split, path in sources.items():
            name = SPLIT_NAMES.get(split, split)
            writer = _SplitWriter(tmp, name, schema, shard_bytes)
            writers.append(writer)
            for line_number, row in _rows(path):
                try:
                    columns = convert(row, tool_calls_as_text=tool_calls_as_text)
                except (HFExportError, KeyError, TypeError, AttributeError) as exc:
                    raise HFExportError(f"{split} row {line_number}: {exc}") from exc
                meta = row.get("metadata") or {}
                episode = meta.get("episode_id") if kind != "preference" else None
                if not with_metadata:
                    columns = {k: v for k, v in columns.items() if k in features}
                writer.add(columns, episode=episode)
            results[name] = writer.close()
        _write_load_from_disk_files(tmp, features, results)
        digest, files = _manifest_sha256(tmp)
        _write_card(tmp, features, results, digest, card or {}, kind)
        if output.exists():
            output.rmdir()  # only ever an empty directory: the command refuses anything else
        os.replace(tmp, output)
    except BaseException:
        for writer in writers:
            writer.abort()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return HFResult(path=str(output), kind=kind, splits=results, sha256=digest, files=files)


def _rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if line.strip():
                yield number, json.loads(line)


def _first_row(path: Path) -> dict[str, Any] | None:
    for _, row in _rows(path):
        return row
    return None


def _write_load_from_disk_files(
    root: Path, features: dict[str, Any], results: dict[str, SplitResult]
) -> None:
    info = {"citation": "", "description": "", "features": features, "homepage": "", "license": ""}
    _write_json(root / "dataset_dict.json", {"splits": list(results)}, indent=None)
    for name, result in results.items():
        hasher = hashlib.sha256()
        for arrow in result.arrow:
            hasher.update(_file_sha256(root / arrow).encode())
        state = {
            "_data_files": [{"filename": Path(a).name} for a in result.arrow],
            "_fingerprint": hasher.hexdigest()[:16],
            "_format_columns": None,
            "_format_kwargs": {},
            "_format_type": None,
            "_output_all_columns": False,
            "_split": name,
        }
        _write_json(root / name / "state.json", state)
        _write_json(root / name / "dataset_info.json", info)


def _write_json(path: Path, value: Any, *, indent: int | None = 2) -> None:
    path.write_text(json.dumps(value, indent=indent, ensure_ascii=False) + "\n", encoding="utf-8")


def _file_sha256(path: Path) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            hasher.update(block)
    return hasher.hexdigest()


def _manifest_sha256(root: Path) -> tuple[str, list[str]]:
    """sha256 of `sha256sum`-style lines for every file but the card, sorted by path."""
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    files = [f for f in files if f != "README.md"]
    lines = "".join(f"{_file_sha256(root / f)}  {f}\n" for f in files)
    return hashlib.sha256(lines.encode()).hexdigest(), files


# --- the dataset card -----------------------------------------------------------------------


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


def _write_card(
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


def zip_directory(directory: Path, target: Path) -> str:
    """A deterministic zip (fixed dates, sorted names, stored) of `directory`; its sha256."""
    names = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_STORED) as archive:
        for name in names:
            info = zipfile.ZipInfo(f"{directory.name}/{name}", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            with open(directory / name, "rb") as src, archive.open(info, "w") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    return _file_sha256(target)
