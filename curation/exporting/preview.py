"""The first rows of an export for the dataset page, images as frame hashes."""

from __future__ import annotations

import json
from typing import Any

from curation.export_options import ExportOptions
from curation.exporting.export import row_kept
from curation.exporting.turn_rows import EpisodeContexts, JsonLists, turn_record, turn_rows
from curation.jsonl import EpisodeContext, RowBuilder
from rollouts.recording.frame_store import FrameStore
from rollouts.review.turn_selection import TurnSelection


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
    contexts = EpisodeContexts(history_frames=options.history_frames)
    rows: list[dict[str, Any]] = []
    episode: EpisodeContext | None = None
    parse = JsonLists()
    for turn in turn_rows(filters)[: limit * 4]:
        if episode is None or episode.episode_id != turn.episode_id:
            episode = contexts.load_for(turn)
        built = builder.row(turn_record(turn, parse), episode)
        if not row_kept(filters, built):
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
