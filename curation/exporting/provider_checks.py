"""Checks of built rows, apart from the writing: a provider's limits, or a token estimate.

`--format openai` checks every row against OpenAI's limits as it is built (`OpenAILimits`),
and a violation anywhere refuses the whole export (`ExportRefused`) before any file is
moved into place. Other formats are not refused; their rows only get a token estimate
(`TokenEstimate`). Both count a row's image tokens from the frames' headers (`ImageInfos`).
"""

from __future__ import annotations

from collections import OrderedDict

from curation.exporting.files import OutputFiles
from curation.jsonl import BuiltRow, FrameRef
from curation.row_formats import row_format as row_format_of
from curation.validation import (
    MIN_ROWS,
    ImageError,
    ImageInfo,
    ProviderReport,
    image_tokens,
    probe_image,
)
from rollouts.recording.frame_store import FrameStore, frame_name

_CACHE_SIZE = 4096


class ExportRefused(Exception):
    """The rows break the provider's limits; nothing was written. `reports` say where."""

    def __init__(self, reports: list[ProviderReport]) -> None:
        self.reports = reports
        count = sum(len(r.violations) for r in reports)
        super().__init__(f"refused by the provider's limits: {count} violation(s)")

    def lines(self) -> list[str]:
        return [str(v) for report in self.reports for v in report.violations]


class ImageInfos:
    """Reads frames for the row builder and keeps what their headers say (None: undecodable)."""

    def __init__(self, store: FrameStore) -> None:
        self.store = store
        self._infos: OrderedDict[str, ImageInfo | None] = OrderedDict()

    def read(self, frame: FrameRef) -> bytes:
        data = self.store.read(frame.name)
        try:
            self._infos[frame.sha256] = probe_image(data)
        except ImageError:
            self._infos[frame.sha256] = None
        self._infos.move_to_end(frame.sha256)
        if len(self._infos) > _CACHE_SIZE:
            self._infos.popitem(last=False)
        return data

    def info(self, sha256: str) -> ImageInfo | None:
        if sha256 not in self._infos:
            self.read(FrameRef(sha256, frame_name(sha256)))
        return self._infos[sha256]


class TokenEstimate:
    """Formats without limits checked here (studio, synth): the rows' image tokens only."""

    def __init__(self, infos: ImageInfos, *, files: tuple[str, ...]) -> None:
        self.infos = infos
        self.reports = {name: ProviderReport(file=name) for name in files}
        self._tokens: dict[tuple[str, str], int] = {}

    def image_tokens(self, built: BuiltRow, *, split: str, row: int, text_chars: int) -> int:
        total = 0
        for sha, _, detail in built.images:
            tokens = self._tokens.get((sha, detail))
            if tokens is None:
                info = self.infos.info(sha)
                tokens = image_tokens(info, detail) if info is not None else 0
                if len(self._tokens) > _CACHE_SIZE:
                    self._tokens.clear()
                self._tokens[(sha, detail)] = tokens
            total += tokens
        return total

    def finish(self, files: OutputFiles) -> None:
        pass


class OpenAILimits:
    """OpenAI's fine-tuning limits on every row and file; a report per file."""

    def __init__(self, infos: ImageInfos, *, files: tuple[str, ...]) -> None:
        self.infos = infos
        self.reports = {name: ProviderReport(file=name) for name in files}

    def image_tokens(self, built: BuiltRow, *, split: str, row: int, text_chars: int) -> int:
        """Checks the row (its 1-based line `row` in `split`'s file); its image tokens."""
        images = [(self.infos.info(sha), role, detail) for sha, role, detail in built.images]
        report = self.reports[split]
        before = report.image_tokens
        report.check_row(
            row=row,
            images=images,
            text_chars=text_chars,
            has_answer=built.has_answer,
            problems=[
                f"image {n}: the stored frame cannot be decoded"
                for n, (info, _, _) in enumerate(images, start=1)
                if info is None
            ],
        )
        return report.image_tokens - before

    def finish(self, files: OutputFiles) -> None:
        """The whole-file limits; ExportRefused if anything broke a limit."""
        for name, sink in files.sinks.items():
            sink.flush()
            self.reports[name].finish(
                file_bytes=sink.result.bytes, min_rows=MIN_ROWS if name == "train" else 1
            )
        failed = [report for report in self.reports.values() if not report.ok]
        if failed:
            raise ExportRefused(failed)


def provider_checks(
    row_format: str, infos: ImageInfos, *, files: tuple[str, ...]
) -> TokenEstimate | OpenAILimits:
    """The checks `row_format` declares, with a report for each of `files`."""
    if row_format_of(row_format).provider_limits:
        return OpenAILimits(infos, files=files)
    return TokenEstimate(infos, files=files)
