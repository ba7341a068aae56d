"""`export_files`: the turns a filter selects, as rows, into JSONL files, in named steps.

Open the files (`OutputFiles`), stream the turns (`turn_rows`) episode by episode
(`_Episodes`: context and split), build each row (`RowBuilder`), keep it or not
(`row_kept`), check and count it (`provider_checks`), write it; then refuse or commit.
Memory does not grow with the number of rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from datasets.exporting.files import ExportResult, OutputFiles
from datasets.exporting.provider_checks import (
    ImageInfos,
    OpenAILimits,
    TokenEstimate,
    provider_checks,
)
from datasets.exporting.turn_rows import EpisodeContexts, JsonLists, TurnRow, turn_record, turn_rows
from datasets.filters import DatasetFilters, ExportOptions, check_combination, turn_queryset
from datasets.jsonl import BuiltRow, EpisodeContext, RowBuilder, episode_split
from datasets.validation import CHARS_PER_TOKEN
from rollouts.frame_store import FrameStore

CHUNK_ROWS = 2000


def export_count(filters: DatasetFilters) -> int:
    return turn_queryset(filters).count()


def export_files(
    *,
    filters: DatasetFilters,
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
    splitting = options.val_fraction > 0 and val_output is not None
    infos = ImageInfos(store or FrameStore())
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
        )
        if progress is not None:
            progress(done)
        files.check_not_empty(allow_empty=options.allow_empty)
        checks.finish(files)
        files.commit()
    except BaseException:
        files.discard()
        raise
    files.result.reports = list(checks.reports.values())
    return files.result


class _Episodes:
    """The context and split of the episode the stream is in, read when it reaches one."""

    def __init__(self, options: ExportOptions, *, splitting: bool) -> None:
        self.contexts = EpisodeContexts(history_frames=options.history_frames)
        self.val_fraction = options.val_fraction if splitting else 0.0
        self.current: EpisodeContext | None = None
        self.split = "train"

    def of(self, row: TurnRow) -> EpisodeContext:
        if self.current is None or self.current.episode_id != row.episode_id:
            self.current = self.contexts.load_for(row)
            self.split = episode_split(
                batch_id=row.batch_id, seed=self.current.seed, val_fraction=self.val_fraction
            )
        return self.current


def row_kept(filters: DatasetFilters, built: BuiltRow) -> bool:
    """The image filters, exactly. SQL selected these rows already; the row is the exact test."""
    if filters.user_image and not built.user_has_image:
        return False
    return not (filters.include_assistant and not built.assistant_has_image)


def _write_rows(
    rows: Iterable[TurnRow],
    *,
    builder: RowBuilder,
    episodes: _Episodes,
    filters: DatasetFilters,
    files: OutputFiles,
    checks: TokenEstimate | OpenAILimits,
    progress: Callable[[int], None] | None,
    every: int,
) -> int:
    """Build, check and write every row kept; the number of turns read."""
    parse = JsonLists()
    done = 0
    for row in rows:
        episode = episodes.of(row)
        built = builder.row(turn_record(row, parse), episode, split=episodes.split)
        done += 1
        if progress is not None and done % every == 0:
            progress(done)
        if row_kept(filters, built):
            _write_row(built, row.episode_id, split=episodes.split, files=files, checks=checks)
    return done


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
