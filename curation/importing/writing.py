"""Pass two of an import: everything written in one transaction."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import transaction

from curation.export_options import ExportOptions
from curation.importing.checking import (
    Plan,
    Row,
    actions_of,
    as_png,
    file_lines,
    parse_line,
    placeholder_png,
)
from curation.importing.existing import lock_file_and_refuse_imported
from curation.jsonl import DEFAULT_TOOLS
from curation.models import Dataset
from rollouts.models import Episode, Frame, RolloutBatch, Turn
from rollouts.recording.frame_store import FrameStore
from rollouts.review.turn_selection import TurnSelection
from studio.row_copy import copy_rows

# Rows per bulk insert.
WRITE_CHUNK = 500


Progress = Callable[[int], None]  # lines written so far


def write_import(
    path: Path,
    plan: Plan,
    *,
    name: str,
    source_name: str,
    created_by,
    progress: Progress | None = None,
    finish: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """All or nothing: rows in one transaction, and on failure the PNGs this import added
    are removed again (a frame file another row already uses is never touched).

    `finish(summary)` runs inside that transaction: what it writes commits with the rows,
    and what it raises undoes them.
    """
    store = FrameStore()
    added: list[tuple[str, str]] = []  # (sha256, storage name) of files this import created
    try:
        return _write(
            path,
            plan,
            store,
            added,
            name=name,
            source_name=source_name,
            created_by=created_by,
            progress=progress,
            finish=finish,
        )
    except BaseException:
        _remove_unused(store, added)
        raise


def _remove_unused(store: FrameStore, added: list[tuple[str, str]]) -> None:
    used = set(
        Frame.objects.filter(sha256__in=[sha for sha, _ in added]).values_list("sha256", flat=True)
    )
    for sha256, storage_name in added:
        if sha256 not in used:
            store.storage.delete(storage_name)


def _write(
    path: Path,
    plan: Plan,
    store: FrameStore,
    added: list[tuple[str, str]],
    *,
    name: str,
    source_name: str,
    created_by,
    progress: Progress | None,
    finish: Callable[[dict[str, Any]], None] | None,
) -> dict[str, Any]:
    """Lock, create the batch and its episodes, write every row's turn and frames in chunks,
    then the episodes' totals and the dataset, all in one transaction."""
    groups = list(plan.groups.items())
    placement = _placement(groups)
    with transaction.atomic():
        lock_file_and_refuse_imported(plan, skip_existing=plan.skip_existing)
        batch = _create_batch(
            plan,
            name=name,
            source_name=source_name,
            episodes=len(groups),
            created_by=created_by,
        )
        episodes = Episode.objects.bulk_create(
            Episode(batch=batch, seed=position, status=Episode.Status.FINISHED)
            for position in range(len(groups))
        )
        turns = _ImportedTurns(episodes, store, added)
        for number, row in _rows_to_write(path, plan):
            position, index = placement[number]
            turns.add(row, position=position, index=index)
            if len(turns.pending_turns) >= WRITE_CHUNK:
                turns.flush()
                if progress is not None:
                    progress(turns.written)
        turns.flush()
        _record_totals(batch, episodes, turns.totals)
        dataset = Dataset.objects.create(
            name=name[:200],
            description=f"Imported from {source_name}",
            filters=TurnSelection(batches=(batch.id,)).to_json(),
            export_options=ExportOptions().to_json(),
            created_by=created_by,
        )
        summary = {
            "dataset_id": dataset.id,
            "batch_id": batch.id,
            "lines": plan.lines,
            "episodes": len(episodes),
            "turns": turns.written,
            "skipped": len(plan.skipped),
            "frames": turns.frames_written,
            "images": turns.images_seen,
        }
        if finish is not None:
            finish(summary)
    return summary


def _placement(
    groups: list[tuple[tuple, list[tuple[int, int | None]]]],
) -> dict[int, tuple[int, int]]:
    """line -> (episode position, turn index). The file's own turn numbers are kept only
    when every line of the episode has one and no two are the same; otherwise the order
    of the lines is the order of the turns."""
    placement: dict[int, tuple[int, int]] = {}
    for position, (_, members) in enumerate(groups):
        turns = [t for _, t in members]
        distinct = all(t is not None for t in turns) and len(set(turns)) == len(turns)
        for order, (line, turn) in enumerate(members):
            placement[line] = (position, turn if distinct else order)
    return placement


def _create_batch(
    plan: Plan, *, name: str, source_name: str, episodes: int, created_by
) -> RolloutBatch:
    settings: dict[str, Any] = {
        "imported_from": source_name,
        "imported_sha256": plan.sha256,
        "lines": plan.lines,
    }
    if plan.tools is not None and plan.tools != DEFAULT_TOOLS:
        settings["tools"] = plan.tools
    return RolloutBatch.objects.create(
        name=name[:200],
        policy=RolloutBatch.Policy.IMPORTED,
        model=next(iter(plan.models)) if len(plan.models) == 1 else "",
        seeds=list(range(episodes)),
        settings=settings,
        status=RolloutBatch.Status.FINISHED,
        episodes_total=episodes,
        episodes_finished=episodes,
        created_by=created_by,
    )


def _rows_to_write(path: Path, plan: Plan) -> Iterator[tuple[int, Row]]:
    """Each line pass one kept, parsed again with its images: holding every line's images
    from pass one would hold the whole file in memory."""
    for number, raw in file_lines(path):
        if number in plan.skipped:
            continue
        assert isinstance(raw, bytes), "pass one refused over-long lines"
        yield number, parse_line(number, raw, keep_images=True)


@dataclass
class _EpisodeTotals:
    steps: int = 0
    reward: float = 0.0
    achievements: dict[str, int] = field(default_factory=dict)  # name -> first turn index
    tool_calls: int = 0


class _ImportedTurns:
    """The turns and frames of the rows read so far, held until a chunk is written, and
    what they add up to per episode."""

    def __init__(
        self, episodes: list[Episode], store: FrameStore, added: list[tuple[str, str]]
    ) -> None:
        self.episodes = episodes
        self.store = store
        self.added = added
        # per episode: sha256 -> its frame, so that an image seen twice is one frame
        self.frames: list[dict[str, Frame]] = [{} for _ in episodes]
        self.totals = [_EpisodeTotals() for _ in episodes]
        self.pending_frames: list[Frame] = []
        self.pending_turns: list[Turn] = []
        self.written = 0
        self.frames_written = 0
        self.images_seen = 0

    def add(self, row: Row, *, position: int, index: int) -> None:
        image_frames = [self._frame_for(position, data) for data in row.images]
        self.images_seen += len(image_frames)
        if row.current_image is not None:
            frame = image_frames[row.current_image]
        else:
            frame = self._frame_for(position, placeholder_png())
        self.pending_turns.append(
            Turn(
                episode=self.episodes[position],
                index=index,
                frame=frame,
                observation_text=row.observation_text,
                request_messages=[_refer_frames(m, image_frames) for m in row.messages],
                model_text=row.model_text,
                tool_calls=row.tool_calls,
                actions=actions_of(row.tool_calls),
                reward=row.reward,
                achievements_unlocked=row.unlocked,
                flagged=row.flagged,
            )
        )
        total = self.totals[position]
        total.steps += 1
        total.reward += row.reward
        total.tool_calls += len(row.tool_calls)
        for achievement in row.unlocked:
            total.achievements.setdefault(achievement, index)
        self.written += 1

    def flush(self) -> None:
        copy_rows(self.pending_frames, self.pending_turns)
        self.pending_frames.clear()
        self.pending_turns.clear()

    def _frame_for(self, position: int, data: bytes) -> Frame:
        png, width, height = as_png(data)
        sha256, storage_name = self.store.stage(png)
        staged = self.store.take_staged()
        # Only a file this import created is removed again if the import fails.
        if staged and not self.store.storage.exists(storage_name):
            self.added.append((sha256, storage_name))
            self.store.write_many(staged)
        known = self.frames[position]
        frame = known.get(sha256)
        if frame is None:
            frame = Frame(
                episode=self.episodes[position],
                step=len(known),
                sha256=sha256,
                image=storage_name,
                width=min(width, 32767),
                height=min(height, 32767),
                state={},
            )
            known[sha256] = frame
            self.pending_frames.append(frame)
            self.frames_written += 1
        return frame


def _record_totals(
    batch: RolloutBatch, episodes: list[Episode], totals: list[_EpisodeTotals]
) -> None:
    for episode, total in zip(episodes, totals, strict=True):
        episode.steps = total.steps
        episode.total_reward = total.reward
        episode.achievements = total.achievements
        episode.achievement_count = len(total.achievements)
        episode.tool_calls = total.tool_calls
    Episode.objects.bulk_update(
        episodes, ["steps", "total_reward", "achievements", "achievement_count", "tool_calls"]
    )
    RolloutBatch.objects.filter(id=batch.id).update(step_limit=max([1, *(t.steps for t in totals)]))


def _refer_frames(message: dict[str, Any], image_frames: list[Frame]) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    parts = []
    for part in content:
        if part.get("type") == "image_url":
            image_url = dict(part["image_url"])
            frame = image_frames[image_url.pop("image")]
            part = {"type": "image_url", "image_url": {"frame_step": frame.step, **image_url}}
        parts.append(part)
    return {**message, "content": parts}
