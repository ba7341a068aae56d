"""Reading for the export: turns in export order as named rows, and each episode's context.

Turns come from a server-side cursor (`iterator`) as named value tuples, not model
instances: building four objects per row cost more than the row itself. Their JSON columns
come as text and are parsed by `JsonLists`. Each episode's context (batch, seed, cumulative
achievements, history frames) is read once, when the stream reaches it.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from django.db.models import F, QuerySet, TextField
from django.db.models.functions import Cast

from curation.jsonl import EpisodeContext, FrameRef, RunningCount, TurnRecord
from rollouts.models import Frame, RolloutBatch, Turn
from rollouts.review.turn_selection import TurnSelection, turns_selected

_SMALL_JSON = 256


class TurnRow(NamedTuple):
    """One turn as `turn_rows` reads it: the row's own fields and its episode's."""

    episode_id: int
    index: int
    observation_text: str
    request_messages_text: str | None
    model_text: str | None
    tool_calls_text: str | None
    actions_text: str | None
    reward: float
    achievements_unlocked_text: str | None
    flagged: bool
    frame_sha256: str
    frame_name: str
    # The episode's own fields ride along: one query less per episode.
    batch_id: int
    seed: int
    text_fallback: bool
    # A reviewer's correction, if any (exported as the tool call; the original in metadata).
    relabel_actions: list[str] | None


# Where each field of TurnRow is read from: JSON columns as text, joined columns renamed.
_COLUMNS: dict[str, Any] = {
    "request_messages_text": Cast("request_messages", TextField()),
    "tool_calls_text": Cast("tool_calls", TextField()),
    "actions_text": Cast("actions", TextField()),
    "achievements_unlocked_text": Cast("achievements_unlocked", TextField()),
    "frame_sha256": F("frame__sha256"),
    "frame_name": F("frame__image"),
    "batch_id": F("episode__batch_id"),
    "seed": F("episode__seed"),
    "relabel_actions": F("relabel__actions"),
}


def turn_rows(filters: TurnSelection) -> QuerySet:
    """The turns the filter selects in export order, as `TurnRow`s."""
    return (
        turns_selected(filters)
        .annotate(**_COLUMNS)
        .order_by("episode_id", "index")
        .values_list(*TurnRow._fields, named=True)
    )


def turn_record(row: TurnRow, parse: JsonLists) -> TurnRecord:
    """A `TurnRow` as the row builder reads it."""
    return TurnRecord(
        episode_id=row.episode_id,
        index=row.index,
        observation_text=row.observation_text,
        request_messages=parse(row.request_messages_text),
        model_text=row.model_text,
        tool_calls=parse(row.tool_calls_text),
        actions=parse(row.actions_text),
        reward=row.reward,
        achievements_unlocked=parse(row.achievements_unlocked_text),
        flagged=row.flagged,
        frame=FrameRef(row.frame_sha256, row.frame_name),
        text_fallback=row.text_fallback,
        relabel_actions=row.relabel_actions,
    )


class JsonLists:
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


class EpisodeContexts:
    """Reads episodes' contexts: per episode, or many in a few queries (`load_many`)."""

    def __init__(self, *, history_frames: int) -> None:
        self.history_frames = history_frames
        self._batches: dict[int, tuple[str, str, list | None]] = {}

    def load(self, episode_id: int, *, batch_id: int, seed: int) -> EpisodeContext:
        return self.load_many({episode_id: (batch_id, seed)})[episode_id]

    def load_for(self, row: TurnRow) -> EpisodeContext:
        """The context of the episode `row` belongs to."""
        return self.load(row.episode_id, batch_id=row.batch_id, seed=row.seed)

    def load_many(self, episodes: dict[int, tuple[int, int]]) -> dict[int, EpisodeContext]:
        """Contexts of `episodes` ({id: (batch id, seed)}) in a few queries, not a few each.

        Cumulative achievements come from the turns that unlocked something (few). With
        history frames every turn's frame is read: pass few episodes then.
        """
        self._load_batches({batch_id for batch_id, _ in episodes.values()})
        turns = Turn.objects.filter(episode_id__in=list(episodes)).order_by("episode_id", "index")
        unlocked: dict[int, list[tuple[int, list[str]]]] = {e: [] for e in episodes}
        turn_frames: dict[int, dict[int, FrameRef]] = {e: {} for e in episodes}
        if self.history_frames:
            for episode_id, index, names, sha, name in turns.values_list(
                "episode_id", "index", "achievements_unlocked", "frame__sha256", "frame__image"
            ):
                unlocked[episode_id].append((index, names))
                turn_frames[episode_id][index] = FrameRef(sha, name)
        else:
            for episode_id, index, names in turns.exclude(achievements_unlocked=[]).values_list(
                "episode_id", "index", "achievements_unlocked"
            ):
                unlocked[episode_id].append((index, names))
        return {
            episode_id: self._context(
                episode_id,
                batch_id=batch_id,
                seed=seed,
                cumulative=RunningCount(unlocked[episode_id]),
                turn_frames=turn_frames[episode_id],
            )
            for episode_id, (batch_id, seed) in episodes.items()
        }

    def _load_batches(self, batch_ids: set[int]) -> None:
        missing = batch_ids - self._batches.keys()
        if not missing:
            return
        for batch_id, model, policy, settings in RolloutBatch.objects.filter(
            id__in=missing
        ).values_list("id", "model", "policy", "settings"):
            tools = settings.get("tools") if isinstance(settings, dict) else None
            self._batches[batch_id] = (model, policy, tools if isinstance(tools, list) else None)

    def _context(
        self,
        episode_id: int,
        *,
        batch_id: int,
        seed: int,
        cumulative: RunningCount,
        turn_frames: dict[int, FrameRef],
    ) -> EpisodeContext:
        model, policy, tools = self._batches[batch_id]

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
            cumulative=cumulative,
            turn_frames=turn_frames,
            frames_by_step=frames_by_step,
            tools=tools,
        )
