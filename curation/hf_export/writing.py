"""Parquet and Arrow shards per split, written a row group at a time, then moved into place."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from curation.hf_export.card import write_card
from curation.hf_export.features import arrow_schema, features_for
from curation.hf_export.rows import (
    HFExportError,
    preference_columns,
    probe_columns,
    sft_columns,
)
from curation.hf_export.splits import SplitResult

SPLIT_NAMES = {"train": "train", "val": "validation"}
ROW_GROUP_ROWS = 256
ROW_GROUP_BYTES = 64 << 20
SHARD_BYTES = 256 << 20


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
        convert = {"preference": preference_columns, "probe": probe_columns}.get(kind, sft_columns)
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
        write_card(tmp, features, results, digest, card or {}, kind)
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
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _manifest_sha256(root: Path) -> tuple[str, list[str]]:
    """sha256 of `sha256sum`-style lines for every file but the card, sorted by path."""
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    files = [f for f in files if f != "README.md"]
    lines = "".join(f"{_file_sha256(root / f)}  {f}\n" for f in files)
    return hashlib.sha256(lines.encode()).hexdigest(), files


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
