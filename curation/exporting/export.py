"""`export_files`: the turns a filter selects, as rows, into JSONL files, in named steps.

Open the files (`OutputFiles`), stream the turns (`turn_rows`) episode by episode
(`_Episodes`: context and split), build each row (`RowBuilder`), keep it or not
(`row_kept`), check and count it (`provider_checks`), write it; then refuse or commit.
Memory does not grow with the number of rows.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from curation.export_options import ExportOptions, check_combination
from curation.exporting.files import ExportResult, OutputFiles
from curation.exporting.frames_ahead import FramesAhead
from curation.exporting.provider_checks import (
    ImageInfos,
    OpenAILimits,
    TokenEstimate,
    provider_checks,
)
from curation.exporting.turn_rows import EpisodeContexts, JsonLists, TurnRow, turn_record, turn_rows
from curation.jsonl import BuiltRow, EpisodeContext, RowBuilder, episode_split
from curation.validation import CHARS_PER_TOKEN
from rollouts.recording.frame_store import FrameStore
from rollouts.review.turn_selection import TurnSelection, turns_selected

CHUNK_ROWS = 2000


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

    With a format that declares `provider_limits` the rows are checked against them as
    they are built, and a violation anywhere refuses the whole export (ExportRefused).
    """
    check_combination(filters, options)
    splitting = options.val_fraction > 0 and val_output is not None
    frames = FramesAhead(store or FrameStore())
    infos = ImageInfos(frames)
    files = OutputFiles(output=output, val_output=val_output if splitting else None)
    checks = provider_checks(options.format, infos, files=tuple(files.sinks))
    try:
        done = _write_rows(
            turn_rows(filters).iterator(chunk_size=chunk_size),
            builder=RowBuilder(
                load_png=infos.read,
                history_frames=options.history_frames,
                row_format=options.format,
            ),
            episodes=_Episodes(options, splitting=splitting),
            filters=filters,
            files=files,
            checks=checks,
            progress=progress,
            every=chunk_size,
            frames_ahead=lambda chunk: frames.ahead(row.frame_name for row in chunk),
        )
        if progress is not None:
            progress(done)
        files.check_not_empty(allow_empty=options.allow_empty)
        checks.finish(files)
        files.commit()
    except BaseException:
        files.discard()
        raise
    finally:
        frames.close()
    files.result.reports = list(checks.reports.values())
    return files.result


class _Episodes:
    """The context and split of each episode the stream reaches.

    Read a chunk of rows at a time, in a few queries; with history frames (every turn's
    frame) one episode at a time, so that memory holds one episode's turns.
    """

    def __init__(self, options: ExportOptions, *, splitting: bool) -> None:
        self.contexts = EpisodeContexts(history_frames=options.history_frames)
        self.val_fraction = options.val_fraction if splitting else 0.0
        self._loaded: dict[int, EpisodeContext] = {}
        self._splits: dict[int, str] = {}

    def read_for(self, rows: list[TurnRow]) -> None:
        """Read the contexts `rows` need; forget the ones they do not."""
        if self.contexts.history_frames:
            return
        wanted = {row.episode_id: (row.batch_id, row.seed) for row in rows}
        loaded = {e: self._loaded[e] for e in wanted if e in self._loaded}
        missing = {e: first for e, first in wanted.items() if e not in loaded}
        if missing:
            loaded.update(self.contexts.load_many(missing))
        self._keep(loaded)

    def of(self, row: TurnRow) -> tuple[EpisodeContext, str]:
        if row.episode_id not in self._loaded:
            self._keep({row.episode_id: self.contexts.load_for(row)})
        return self._loaded[row.episode_id], self._splits[row.episode_id]

    def _keep(self, loaded: dict[int, EpisodeContext]) -> None:
        self._loaded = loaded
        self._splits = {
            e: episode_split(batch_id=c.batch_id, seed=c.seed, val_fraction=self.val_fraction)
            for e, c in loaded.items()
        }


def row_kept(filters: TurnSelection, built: BuiltRow) -> bool:
    """The image filters, exactly. SQL selected these rows already; the row is the exact test."""
    if filters.user_image and not built.user_has_image:
        return False
    return not (filters.include_assistant and not built.assistant_has_image)


def _write_rows(
    rows: Iterable[TurnRow],
    *,
    builder: RowBuilder,
    episodes: _Episodes,
    filters: TurnSelection,
    files: OutputFiles,
    checks: TokenEstimate | OpenAILimits,
    progress: Callable[[int], None] | None,
    every: int,
    frames_ahead: Callable[[list[TurnRow]], None],
) -> int:
    """Build, check and write every row kept; the number of turns read.

    Each chunk's frames are read ahead while the chunk before it is built."""
    parse = JsonLists()
    done = 0
    chunks = _chunks(rows, every)
    upcoming = next(chunks, None)
    if upcoming is not None:
        frames_ahead(upcoming)
    while upcoming is not None:
        chunk, upcoming = upcoming, next(chunks, None)
        frames_ahead(upcoming or [])
        episodes.read_for(chunk)
        for row in chunk:
            episode, split = episodes.of(row)
            built = builder.row(turn_record(row, parse), episode, split=split)
            done += 1
            if progress is not None and done % every == 0:
                progress(done)
            if row_kept(filters, built):
                _write_row(built, row.episode_id, split=split, files=files, checks=checks)
    return done


def _chunks(rows: Iterable[TurnRow], size: int) -> Iterator[list[TurnRow]]:
    iterator = iter(rows)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def _write_row(
    built: BuiltRow,
    episode_id: int,
    *,
    split: str,
    files: OutputFiles,
    checks: TokenEstimate | OpenAILimits,
) -> None:
    sink = files.sinks[split]
    text_chars = len(built.text) - built.image_chars
    image_tokens = checks.image_tokens(
        built, split=split, row=sink.result.rows + 1, text_chars=text_chars
    )
    sink.result.estimated_tokens += text_chars // CHARS_PER_TOKEN + image_tokens
    sink.add(built.text, episode_id, len(built.images))
