"""Streams the turns a filter selects into JSONL files: the export behind command and task.

Turns are read in index order per episode with a server-side cursor (`iterator`), as value
tuples (no model instances: building four objects per row cost more than the row itself);
each episode's context (batch, seed, cumulative achievements, history frames) is read once
when the stream reaches it. Rows go to a temporary file beside the target, hashed as they are
written, and the file is moved into place only when complete: a failed or refused export
leaves nothing behind. Memory does not grow with the number of rows.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db.models import TextField
from django.db.models.functions import Cast

from datasets.export_options import ExportOptions, check_combination
from datasets.jsonl import (
    EpisodeContext,
    FrameRef,
    RowBuilder,
    TurnRecord,
    cumulative_unique,
    episode_split,
)
from datasets.validation import (
    CHARS_PER_TOKEN,
    ImageError,
    ImageInfo,
    ProviderReport,
    image_tokens,
    probe_image,
)
from rollouts.frame_store import FrameStore, frame_name
from rollouts.models import Frame, RolloutBatch, Turn
from rollouts.turn_selection import TurnSelection, turns_selected

CHUNK_ROWS = 2000
FLUSH_CHARS = 1 << 20
_TURN_FIELDS = (
    "episode_id",
    "index",
    "observation_text",
    "request_messages_text",
    "model_text",
    "tool_calls_text",
    "actions_text",
    "reward",
    "achievements_unlocked_text",
    "flagged",
    "frame__sha256",
    "frame__image",
    # The episode's own fields ride along: one query less per episode.
    "episode__batch_id",
    "episode__seed",
    "text_fallback",
    # A reviewer's correction, if any (exported as the tool call; the original in metadata).
    "relabel__actions",
)
_JSON_FIELDS = ("request_messages", "tool_calls", "actions", "achievements_unlocked")
_SMALL_JSON = 256


def _turn_rows(filters: TurnSelection):
    """Turn values in export order, JSON columns as text (see `_JsonLists`)."""
    return (
        turns_selected(filters)
        .annotate(**{f"{name}_text": Cast(name, TextField()) for name in _JSON_FIELDS})
        .order_by("episode_id", "index")
        .values_list(*_TURN_FIELDS)
    )


def _record(values: tuple, parse: _JsonLists) -> TurnRecord:
    """A row of `_turn_rows` as the row builder reads it."""
    return TurnRecord(
        episode_id=values[0],
        index=values[1],
        observation_text=values[2],
        request_messages=parse(values[3]),
        model_text=values[4],
        tool_calls=parse(values[5]),
        actions=parse(values[6]),
        reward=values[7],
        achievements_unlocked=parse(values[8]),
        flagged=values[9],
        frame=FrameRef(values[10], values[11]),
        text_fallback=values[14],
        relabel_actions=values[15],
    )


class _JsonLists:
    """Parses the JSON columns of turns; most are `[]` or repeat (the same actions).

    Decoding four JSON values per row through the ORM cost more than building the row, so
    they come as text and small ones are parsed once. Parsed values are shared: read-only.
    """

    def __init__(self) -> None:
        self._cache: dict[str, Any] = {"[]": []}

    def __call__(self, text: str | None) -> Any:
        if text is None:
            return []
        value = self._cache.get(text)
        if value is None:
            value = json.loads(text)
            if len(text) <= _SMALL_JSON:
                if len(self._cache) > 4096:
                    self._cache.clear()
                    self._cache["[]"] = []
                self._cache[text] = value
        return value


class ExportEmpty(Exception):
    """The training file would have no rows; nothing was written (see `allow_empty`)."""

    def __init__(self, *, val_rows: int) -> None:
        self.val_rows = val_rows
        where = f" ({val_rows} went to validation)" if val_rows else ""
        super().__init__(
            f"no rows to export{where}: the filter selects nothing for the training file; "
            "pass --allow-empty to write an empty file anyway"
        )


class ExportRefused(Exception):
    """The rows break the provider's limits; nothing was written. `reports` say where."""

    def __init__(self, reports: list[ProviderReport]) -> None:
        self.reports = reports
        count = sum(len(r.violations) for r in reports)
        super().__init__(f"refused by the provider's limits: {count} violation(s)")

    def lines(self) -> list[str]:
        return [str(v) for report in self.reports for v in report.violations]


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


class _Sink:
    """One output file: buffered, hashed while written, moved into place on commit."""

    def __init__(self, target: Path, result: FileResult) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-export-", suffix=".jsonl")
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


class _EpisodeContexts:
    """Reads each episode's context once, when the stream reaches it."""

    def __init__(self, *, history_frames: int) -> None:
        self.history_frames = history_frames
        self._batches: dict[int, tuple[str, str, list | None]] = {}

    def load(self, episode_id: int, *, batch_id: int, seed: int) -> EpisodeContext:
        if batch_id not in self._batches:
            model, policy, settings = RolloutBatch.objects.filter(id=batch_id).values_list(
                "model", "policy", "settings"
            )[0]
            tools = settings.get("tools") if isinstance(settings, dict) else None
            self._batches[batch_id] = (model, policy, tools if isinstance(tools, list) else None)
        model, policy, tools = self._batches[batch_id]
        fields = ["index", "achievements_unlocked"]
        if self.history_frames:
            fields += ["frame__sha256", "frame__image"]
        turns = list(
            Turn.objects.filter(episode_id=episode_id).order_by("index").values_list(*fields)
        )
        turn_frames = {t[0]: FrameRef(t[2], t[3]) for t in turns} if self.history_frames else {}

        def frames_by_step() -> dict[int, FrameRef]:
            return {
                step: FrameRef(sha, name)
                for step, sha, name in Frame.objects.filter(episode_id=episode_id).values_list(
                    "step", "sha256", "image"
                )
            }

        return EpisodeContext(
            episode_id=episode_id,
            batch_id=batch_id,
            seed=int(seed),
            model=model,
            policy=policy,
            cumulative=cumulative_unique([(t[0], t[1]) for t in turns]),
            turn_frames=turn_frames,
            frames_by_step=frames_by_step,
            tools=tools,
        )


def export_count(filters: TurnSelection) -> int:
    return turns_selected(filters).count()


def export_files(
    *,
    filters: TurnSelection,
    options: ExportOptions,
    output: Path,
    val_output: Path | None = None,
    progress: Callable[[int], None] | None = None,
    chunk_size: int = CHUNK_ROWS,
    store: FrameStore | None = None,
) -> ExportResult:
    """Write the rows; with `val_output` and a val fraction, split by episode into two files.

    With `options.format == "openai"` the rows are checked against the provider's limits as
    they are built, and a violation anywhere refuses the whole export (ExportRefused).
    """
    check_combination(filters, options)
    store = store or FrameStore()
    openai = options.format == "openai"
    split_on = options.val_fraction > 0 and val_output is not None
    infos: OrderedDict[str, ImageInfo | None] = OrderedDict()

    def load_png(frame: FrameRef) -> bytes:
        data = store.read(frame.name)
        try:
            infos[frame.sha256] = probe_image(data)
        except ImageError:
            infos[frame.sha256] = None
        infos.move_to_end(frame.sha256)
        if len(infos) > 4096:
            infos.popitem(last=False)
        return data

    def info_of(sha256: str) -> ImageInfo | None:
        if sha256 not in infos:
            load_png(FrameRef(sha256, frame_name(sha256)))
        return infos[sha256]

    builder = RowBuilder(
        load_png=load_png, history_frames=options.history_frames, row_format=options.format
    )
    contexts = _EpisodeContexts(history_frames=options.history_frames)
    result = ExportResult(train=FileResult(path=str(output)))
    train = _Sink(output, result.train)
    sinks = {"train": train}
    reports = {"train": ProviderReport(file="train")}
    if split_on:
        assert val_output is not None
        result.val = FileResult(path=str(val_output))
        sinks["val"] = _Sink(val_output, result.val)
        reports["val"] = ProviderReport(file="val")
    try:
        queryset = _turn_rows(filters)
        parse = _JsonLists()
        token_memo: dict[tuple[str, str], int] = {}
        episode: EpisodeContext | None = None
        split = "train"
        done = 0
        for values in queryset.iterator(chunk_size=chunk_size):
            episode_id = values[0]
            if episode is None or episode.episode_id != episode_id:
                episode = contexts.load(episode_id, batch_id=values[12], seed=values[13])
                split = (
                    episode_split(
                        batch_id=episode.batch_id,
                        seed=episode.seed,
                        val_fraction=options.val_fraction,
                    )
                    if split_on
                    else "train"
                )
            record = _record(values, parse)
            built = builder.row(record, episode, split=split)
            done += 1
            if progress is not None and done % chunk_size == 0:
                progress(done)
            # SQL selected these already on PostgreSQL; the row itself is the exact test.
            if filters.user_image and not built.user_has_image:
                continue
            if filters.include_assistant and not built.assistant_has_image:
                continue
            sink = sinks[split]
            text_chars = len(built.text) - built.image_chars
            if openai:
                images = [(info_of(sha), role, detail) for sha, role, detail in built.images]
                report = reports[split]
                before = report.image_tokens
                report.check_row(
                    row=sink.result.rows + 1,
                    images=images,
                    text_chars=text_chars,
                    has_answer=built.has_answer,
                    problems=[
                        f"image {n}: the stored frame cannot be decoded"
                        for n, info in enumerate(images, start=1)
                        if info[0] is None
                    ],
                )
                row_image_tokens = report.image_tokens - before
            else:
                row_image_tokens = 0
                for sha, _, detail in built.images:
                    tokens = token_memo.get((sha, detail))
                    if tokens is None:
                        info = info_of(sha)
                        tokens = image_tokens(info, detail) if info is not None else 0
                        if len(token_memo) > 4096:
                            token_memo.clear()
                        token_memo[(sha, detail)] = tokens
                    row_image_tokens += tokens
            sink.result.estimated_tokens += text_chars // CHARS_PER_TOKEN + row_image_tokens
            sink.add(built.text, episode_id, len(built.images))
        if progress is not None:
            progress(done)
        if not result.train.rows and not options.allow_empty:
            raise ExportEmpty(val_rows=result.val.rows if result.val else 0)
        if openai:
            for name, sink in sinks.items():
                sink.flush()
                reports[name].finish(
                    file_bytes=sink.result.bytes, min_rows=10 if name == "train" else 1
                )
            failed = [r for r in reports.values() if not r.ok]
            if failed:
                raise ExportRefused(failed)
        for sink in sinks.values():
            sink.commit()
    except BaseException:
        for sink in sinks.values():
            sink.discard()
        raise
    result.reports = list(reports.values())
    return result


def preview_rows(
    *, filters: TurnSelection, options: ExportOptions, limit: int = 5, store=None
) -> list[dict[str, Any]]:
    """The first rows as the export builds them, image data swapped for frame hashes.

    Image parts become `{"type": "image", "sha256": ...}` so a page can show them through
    the frame view instead of inlining base64.
    """
    store = store or FrameStore()
    builder = RowBuilder(
        load_png=lambda frame: store.read(frame.name),
        history_frames=options.history_frames,
        row_format="studio",
    )
    contexts = _EpisodeContexts(history_frames=options.history_frames)
    rows: list[dict[str, Any]] = []
    episode: EpisodeContext | None = None
    parse = _JsonLists()
    for values in _turn_rows(filters)[: limit * 4]:
        if episode is None or episode.episode_id != values[0]:
            episode = contexts.load(values[0], batch_id=values[12], seed=values[13])
        record = _record(values, parse)
        built = builder.row(record, episode)
        if filters.user_image and not built.user_has_image:
            continue
        if filters.include_assistant and not built.assistant_has_image:
            continue
        row = json.loads(built.text)
        shas = iter(sha for sha, _, _ in built.images)
        for message in row["messages"]:
            if isinstance(message.get("content"), list):
                message["content"] = [
                    {"type": "image", "sha256": next(shas)}
                    if part.get("type") == "image_url"
                    else part
                    for part in message["content"]
                ]
        rows.append(row)
        if len(rows) >= limit:
            break
    return rows
