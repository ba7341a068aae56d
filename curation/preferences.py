"""Preference pairs (DPO) from episodes that saw the same state and answered differently.

Two episodes of the same seed, image size and step limit play the same world; while they
take the same actions they see the same frames. The first turn where both saw the same frame
(same sha256, and the same frames at every turn before) but answered with different actions
is where they diverge: its prompt is what both saw, `chosen` is the answer of the episode
that went on to more unique achievements (then more reward) and `rejected` the other's.
Ties give no pair, and so do episodes that never diverge (identical plays) or whose frames
differ before their answers do. This holds for any two such episodes: the K samples of a
seed, two batches on the same seeds, a fork and its original at the fork turn.

Candidates are the episodes the dataset filter selects; both divergence turns must be turns
the filter selects (a flagged or failed turn excluded there makes no pair).

Rows (`kind` "preference"), studio format, TRL's vision DPO shape:
    {"prompt": [messages, image parts as {"type": "image"}], "chosen": [assistant message],
     "rejected": [assistant message], "images": ["data:image/png;base64,...", ...],
     "tools": [...], "metadata": {"seed", "turn", "image_size", "step_limit",
                                  "chosen": outcome, "rejected": outcome, "split"}}
and OpenAI's preference format (a format whose `preference_rows` is "openai"):
    {"input": {"messages": [...], "tools": [...]}, "preferred_output": [assistant message],
     "non_preferred_output": [assistant message]}
Splits go by seed: every pair of a seed lands in the same file.
"""

from __future__ import annotations

import itertools
import json
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from curation.export_options import ExportOptions
from curation.exporting.files import ExportResult, OutputFiles
from curation.exporting.turn_rows import EpisodeContexts, JsonLists, turn_rows
from curation.jsonl import (
    EpisodeContext,
    FrameRef,
    RowBuilder,
    TurnRecord,
    dumps,
    episode_split,
)
from curation.row_formats import row_format
from rollouts.models import Episode, Turn
from rollouts.recording.frame_store import FrameStore
from rollouts.review.turn_selection import TurnSelection, turns_selected


@dataclass(frozen=True)
class Outcome:
    episode_id: int
    batch_id: int
    sample: int
    unique_achievements: int
    reward: float

    @property
    def rank(self) -> tuple[int, float]:
        return (self.unique_achievements, self.reward)

    def as_json(self) -> dict[str, Any]:
        return {
            "episode_id": self.episode_id,
            "batch_id": self.batch_id,
            "sample": self.sample,
            "unique_achievements": self.unique_achievements,
            "reward": self.reward,
        }


@dataclass(frozen=True)
class Pair:
    seed: int
    image_size: int
    step_limit: int
    turn: int
    chosen: Outcome
    rejected: Outcome


def divergence_turn(a: list[tuple[str, list[str]]], b: list[tuple[str, list[str]]]) -> int | None:
    """The first turn both saw the same frame and answered differently; None if there is none.

    `a` and `b` are (frame sha256, actions) per turn index, from turn 0 on.
    """
    for index, ((sha_a, actions_a), (sha_b, actions_b)) in enumerate(zip(a, b, strict=False)):
        if sha_a != sha_b:
            return None  # different states before any different answer: not comparable
        if list(actions_a) != list(actions_b):
            return index
    return None


def find_pairs(filters: TurnSelection) -> Iterator[Pair]:
    """Every pair the filter's episodes give, in a stable order (seed, then episodes)."""
    selected = turns_selected(filters)
    episodes = (
        Episode.objects.filter(id__in=selected.values("episode_id"))
        .order_by("seed", "batch__image_size", "batch__step_limit", "batch_id", "sample", "id")
        .values_list(
            "id",
            "batch_id",
            "sample",
            "achievement_count",
            "total_reward",
            "seed",
            "batch__image_size",
            "batch__step_limit",
        )
    )
    group_key = lambda row: (row[5], row[6], row[7])  # noqa: E731
    for (seed, size, limit), rows in itertools.groupby(episodes.iterator(), key=group_key):
        members = [Outcome(r[0], r[1], r[2], r[3], float(r[4])) for r in rows]
        if len(members) < 2:
            continue
        ids = [m.episode_id for m in members]
        played: dict[int, list[tuple[str, list[str]]]] = {i: [] for i in ids}
        for episode_id, sha, actions in (
            Turn.objects.filter(episode_id__in=ids)
            .order_by("episode_id", "index")
            .values_list("episode_id", "frame__sha256", "actions")
        ):
            played[episode_id].append((sha, actions))
        kept = set(selected.filter(episode_id__in=ids).values_list("episode_id", "index"))
        for first, second in itertools.combinations(members, 2):
            if first.rank == second.rank:
                continue  # a tie says nothing about which answer was better
            turn = divergence_turn(played[first.episode_id], played[second.episode_id])
            if turn is None:
                continue
            chosen, rejected = (first, second) if first.rank > second.rank else (second, first)
            if (chosen.episode_id, turn) not in kept or (rejected.episode_id, turn) not in kept:
                continue
            yield Pair(seed, size, limit, turn, chosen, rejected)


def count_pairs(filters: TurnSelection, *, max_episodes: int) -> int | None:
    """Pairs the filter gives, for the live counts; None past `max_episodes` (too slow)."""
    episodes = turns_selected(filters).values("episode_id").distinct().count()
    if episodes > max_episodes:
        return None
    return sum(1 for _ in find_pairs(filters))


def preference_preview(filters: TurnSelection, *, limit: int = 5) -> list[dict[str, Any]]:
    """The first pairs for the dataset page: the shared frame and both answers."""
    out = []
    for pair in itertools.islice(find_pairs(filters), limit):
        turns = {
            t.episode_id: t
            for t in Turn.objects.filter(
                episode_id__in=[pair.chosen.episode_id, pair.rejected.episode_id], index=pair.turn
            ).select_related("frame")
        }
        chosen, rejected = turns[pair.chosen.episode_id], turns[pair.rejected.episode_id]
        out.append(
            {
                "pair": pair,
                "frame_sha256": chosen.frame.sha256,
                "observation_text": chosen.observation_text,
                "chosen": {"text": chosen.model_text, "actions": chosen.actions},
                "rejected": {"text": rejected.model_text, "actions": rejected.actions},
            }
        )
    return out


class PreferenceRows:
    """Builds preference rows from pairs with the SFT row builder (one row format)."""

    def __init__(self, *, options: ExportOptions, store: FrameStore) -> None:
        self.options = options
        self.builder = RowBuilder(
            load_png=lambda frame: store.read(frame.name),
            history_frames=options.history_frames,
            row_format="studio",
        )
        self.contexts = EpisodeContexts(history_frames=options.history_frames)
        # Pairs of a seed reuse the same few episodes: keep their contexts while they do.
        self._recent: OrderedDict[int, EpisodeContext] = OrderedDict()
        self.parse = JsonLists()

    def _context(self, episode_id: int, *, batch_id: int, seed: int) -> EpisodeContext:
        context = self._recent.get(episode_id)
        if context is None:
            context = self.contexts.load(episode_id, batch_id=batch_id, seed=seed)
            self._recent[episode_id] = context
            if len(self._recent) > 64:
                self._recent.popitem(last=False)
        self._recent.move_to_end(episode_id)
        return context

    def _sft_row(self, episode_id: int, turn: int) -> tuple[dict[str, Any], int]:
        row = turn_rows(TurnSelection()).filter(episode_id=episode_id, index=turn).first()
        if row is None:
            raise LookupError(f"episode {episode_id} has no turn {turn}")
        context = self._context(row.episode_id, batch_id=row.batch_id, seed=row.seed)
        # What the episode answered, as played: a pair compares the two episodes' own answers.
        record = TurnRecord(
            episode_id=row.episode_id,
            index=row.index,
            observation_text=row.observation_text,
            request_messages=self.parse(row.request_messages_text),
            model_text=row.model_text,
            tool_calls=self.parse(row.tool_calls_text),
            actions=self.parse(row.actions_text),
            reward=row.reward,
            achievements_unlocked=self.parse(row.achievements_unlocked_text),
            flagged=row.flagged,
            frame=FrameRef(row.frame_sha256, row.frame_name),
        )
        built = self.builder.row(record, context)
        return json.loads(built.text), len(built.images)

    def row(self, pair: Pair, *, split: str) -> tuple[str, int]:
        """The row's JSON line and its image count."""
        chosen, images = self._sft_row(pair.chosen.episode_id, pair.turn)
        rejected, _ = self._sft_row(pair.rejected.episode_id, pair.turn)
        prompt = chosen["messages"][:-1]
        tools = chosen["tools"]
        if row_format(self.options.format).preference_rows == "openai":
            row: dict[str, Any] = {
                "input": {"messages": prompt, "tools": tools},
                "preferred_output": chosen["messages"][-1:],
                "non_preferred_output": rejected["messages"][-1:],
            }
            return dumps(row) + "\n", images
        urls: list[str] = []
        row = {
            "prompt": [_with_placeholders(m, urls) for m in prompt],
            "chosen": chosen["messages"][-1:],
            "rejected": rejected["messages"][-1:],
            "images": urls,
            "tools": tools,
            "metadata": {
                "seed": pair.seed,
                "turn": pair.turn,
                "image_size": pair.image_size,
                "step_limit": pair.step_limit,
                "chosen": pair.chosen.as_json(),
                "rejected": pair.rejected.as_json(),
                "split": split,
            },
        }
        return dumps(row) + "\n", len(urls)


def _with_placeholders(message: dict[str, Any], urls: list[str]) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    parts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "image_url":
            urls.append(part["image_url"]["url"])
            parts.append({"type": "image"})
        else:
            parts.append(part)
    return {**message, "content": parts}


def pair_split(*, seed: int, val_fraction: float) -> str:
    return episode_split(batch_id=0, seed=seed, val_fraction=val_fraction)


def export_preference_files(
    *,
    filters: TurnSelection,
    options: ExportOptions,
    output: Path,
    val_output: Path | None = None,
    progress: Callable[[int], None] | None = None,
    store: FrameStore | None = None,
) -> ExportResult:
    """Write preference rows; like `export_files`, nothing is left behind on failure."""
    rows = PreferenceRows(options=options, store=store or FrameStore())
    splitting = options.val_fraction > 0 and val_output is not None
    files = OutputFiles(output=output, val_output=val_output if splitting else None)
    episodes: dict[str, set[int]] = {name: set() for name in files.sinks}
    try:
        for done, pair in enumerate(find_pairs(filters), start=1):
            split = (
                pair_split(seed=pair.seed, val_fraction=options.val_fraction)
                if splitting
                else "train"
            )
            text, images = rows.row(pair, split=split)
            files.sinks[split].add(text, pair.chosen.episode_id, images)
            episodes[split].update((pair.chosen.episode_id, pair.rejected.episode_id))
            if progress is not None:
                progress(done)
        files.check_not_empty(allow_empty=options.allow_empty)
        files.commit()
    except BaseException:
        files.discard()
        raise
    for name, sink in files.sinks.items():
        sink.result.episodes = len(episodes[name])
    return files.result
