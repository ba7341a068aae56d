"""Writing for the export: output files that appear whole or not at all, and what they hold.

Rows go to a temporary file beside the target, hashed as they are written, and the file is
moved into place only when complete: a failed or refused export leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from curation.validation import ProviderReport

FLUSH_CHARS = 1 << 20


class ExportEmpty(Exception):
    """The training file would have no rows; nothing was written (see `allow_empty`)."""

    def __init__(self, *, val_rows: int) -> None:
        self.val_rows = val_rows
        where = f" ({val_rows} went to validation)" if val_rows else ""
        super().__init__(
            f"no rows to export{where}: the filter selects nothing for the training file; "
            "pass --allow-empty to write an empty file anyway"
        )


@dataclass
class FileResult:
    path: str
    rows: int = 0
    episodes: int = 0
    images: int = 0
    sha256: str = ""
    bytes: int = 0
    estimated_tokens: int = 0

    def summary(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "episodes": self.episodes,
            "images": self.images,
            "path": self.path,
            "sha256": self.sha256,
        }


@dataclass
class ExportResult:
    train: FileResult
    val: FileResult | None = None
    reports: list[ProviderReport] = field(default_factory=list)

    def warnings(self) -> list[str]:
        """What a user should hear about though the export went through."""
        if self.val is not None and not self.val.rows:
            return [
                "warning: the validation split has 0 rows (no episode fell into it); "
                "raise the validation fraction or select more episodes"
            ]
        return []

    def summary(self) -> dict[str, Any]:
        data = self.train.summary()
        data["estimated_tokens"] = self.train.estimated_tokens
        if self.val is not None:
            data["val"] = self.val.summary()
            data["val"]["estimated_tokens"] = self.val.estimated_tokens
        return data


def sink_prefix(target: Path) -> str:
    """How the temporary files of `target` begin: named after it, so that the next attempt
    at the same file can find and remove what an attempt killed mid-write left."""
    return f".tmp-export-{target.name}-"


def sinks_left_remove(target: Path) -> int:
    """Remove the temporary files an earlier attempt at `target` left beside it (its worker
    was killed before it could), and return how many. Only for a caller that alone writes
    `target` now (an export that holds its version's claim)."""
    removed = 0
    for leftover in target.parent.glob(f"{glob.escape(sink_prefix(target))}*"):
        with contextlib.suppress(FileNotFoundError):
            leftover.unlink()
            removed += 1
    return removed


class FileSink:
    """One output file: buffered, hashed while written, moved into place on commit."""

    def __init__(self, target: Path, result: FileResult) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=sink_prefix(target), suffix=".jsonl")
        self.target = target
        self.tmp = Path(tmp)
        self.fh = os.fdopen(fd, "wb")
        self.hasher = hashlib.sha256()
        self.pending: list[str] = []
        self.pending_chars = 0
        self.result = result
        self.last_episode: int | None = None

    def add(self, text: str, episode_id: int, images: int) -> None:
        self.pending.append(text)
        self.pending_chars += len(text)
        self.result.rows += 1
        self.result.images += images
        if episode_id != self.last_episode:
            self.result.episodes += 1
            self.last_episode = episode_id
        if self.pending_chars >= FLUSH_CHARS:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        data = "".join(self.pending).encode("utf-8")
        self.pending.clear()
        self.pending_chars = 0
        self.hasher.update(data)
        self.fh.write(data)
        self.result.bytes += len(data)

    def commit(self) -> None:
        self.flush()
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        os.chmod(self.tmp, 0o644)
        os.replace(self.tmp, self.target)
        self.result.sha256 = self.hasher.hexdigest()

    def discard(self) -> None:
        if not self.fh.closed:
            self.fh.close()
        self.tmp.unlink(missing_ok=True)


class OutputFiles:
    """The export's files by split name, "train" and, when splitting, "val"."""

    def __init__(self, *, output: Path, val_output: Path | None) -> None:
        self.result = ExportResult(train=FileResult(path=str(output)))
        self.sinks = {"train": FileSink(output, self.result.train)}
        if val_output is not None:
            self.result.val = FileResult(path=str(val_output))
            try:
                self.sinks["val"] = FileSink(val_output, self.result.val)
            except BaseException:
                self.discard()
                raise

    def check_not_empty(self, *, allow_empty: bool) -> None:
        if not self.result.train.rows and not allow_empty:
            raise ExportEmpty(val_rows=self.result.val.rows if self.result.val else 0)

    def commit(self) -> None:
        for sink in self.sinks.values():
            sink.commit()

    def discard(self) -> None:
        for sink in self.sinks.values():
            sink.discard()
