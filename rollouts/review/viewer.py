"""What the episode viewer reads: an episode's index of turns (cached for long games), one
turn in full, its texts cut for the page and whole on demand."""

from __future__ import annotations

import base64
import gc
import json
from bisect import bisect_left
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db.models import Max, Min
from django.db.models.fields.json import KeyTextTransform, KeyTransform

from rollouts.models import Episode, Frame, RolloutBatch, Turn
from studio.cached import cached


@dataclass(frozen=True)
class EpisodeIndex:
    """What the viewer's page carries: the episode and a compact index of its turns."""

    episode: Episode
    count: int
    # The recorded columns, one entry per position in the viewer (see `episode_index`), as
    # JSON escaped for a <script> element (what `json_script` gives).
    recorded_json: str
    # Positions of the flagged turns: a reviewer's marks, read anew for every page.
    flagged: list[int]
    # (achievement, position in the viewer, turn index) in the order they were unlocked.
    unlocked: list[tuple[str, int, int]]
    frame_digests: bytes  # 32 bytes of sha256 per position

    @property
    def columns(self) -> dict[str, Any]:
        """Every column as the page's script sees them (recorded and flagged)."""
        return json.loads(self.recorded_json) | {"flagged": self.flagged}

    def frame(self, position: int) -> str:
        """The sha256 of the frame at `position`, in hex."""
        return self.frame_digests[32 * position : 32 * position + 32].hex()


# The vitals the viewer's chart draws, each 0-9 in Crafter.
CHART_VITALS = ("health", "food", "drink", "energy")


# An ended episode's recorded columns never change (a replay after a failure is a new
# attempt): long ones are kept in the cache, so opening one again, or by another reviewer,
# costs one cache read instead of reading and encoding every turn. Short ones are cheap.
VIEWER_CACHE_MIN_TURNS = 1_000


VIEWER_CACHE_SECONDS = 24 * 3600


_ENDED = (Episode.Status.FINISHED, Episode.Status.FAILED, Episode.Status.CANCELED)


@dataclass(frozen=True)
class _Recorded:
    """What an episode recorded, as the viewer's index has it (cached for long episodes)."""

    json: str
    turns: list[int]  # each position's turn index, ascending
    unlocked: list[tuple[str, int, int]]
    frame_digests: bytes


def episode_index(*, episode_id: int) -> EpisodeIndex:
    """The viewer's page: one row per turn, only what the scrubber, filmstrip, chart and the
    keys that move by kind need, in columns (10,000 turns make ~0.6 MB, not 16).

    Each turn's texts come from `episode_turn` when the viewer's cursor gets near it.
    """
    episode = Episode.objects.select_related("batch").get(id=episode_id)
    if episode.status in _ENDED and episode.steps >= VIEWER_CACHE_MIN_TURNS:
        # Everything that tells this episode's recording from another's, in a database made
        # again (ids restart) or after a replay.
        ended = episode.finished_at.isoformat() if episode.finished_at else ""
        key = (
            f"viewer-index:1:{episode.id}:{episode.batch.created_at.isoformat()}:{ended}:"
            f"{episode.attempts}:{episode.status}:{episode.steps}"
        )
        recorded = cached(key, lambda: _recorded_index(episode_id)[0], seconds=VIEWER_CACHE_SECONDS)
        flagged = _flagged_positions(episode_id, recorded.turns)
    else:
        recorded, flagged = _recorded_index(episode_id)
    turns = recorded.turns
    return EpisodeIndex(
        episode=episode,
        count=len(turns),
        recorded_json=recorded.json,
        flagged=flagged,
        unlocked=recorded.unlocked,
        frame_digests=recorded.frame_digests,
    )


def _flagged_positions(episode_id: int, turns: list[int]) -> list[int]:
    """The positions of the episode's flagged turns (off turn_list_flagged_idx)."""
    positions = []
    for index in (
        Turn.objects.filter(episode_id=episode_id, flagged=True)
        .order_by("index")
        .values_list("index", flat=True)
    ):
        position = bisect_left(turns, index)  # turns are in ascending order
        if position < len(turns) and turns[position] == index:
            positions.append(position)
    return positions


@contextmanager
def _no_collection() -> Iterator[None]:
    """Python's cycle collector off for a while. A 10,000-turn index makes tens of thousands
    of short-lived rows and lists, each freed as soon as its columns are built; counted as
    allocations, they set off collections of the whole process's heap, on one page in several.
    None of them is a cycle."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@_no_collection()
def _recorded_index(episode_id: int) -> tuple[_Recorded, list[int]]:
    """The recorded columns, and the flagged positions read in the same query."""
    vitals = {
        f"vital_{name}": KeyTextTransform(name, KeyTransform("vitals", "frame__state"))
        for name in CHART_VITALS
    }
    turns = Turn.objects.filter(episode_id=episode_id).order_by("index")
    # What turn_viewer_idx holds (a VLM turn's row is kilobytes wide: never read here), and
    # its frame's step, sha256 and vitals; no JSON decoded per row.
    rows = list(
        turns.annotate(**vitals).values_list(
            "index", "frame__step", "frame__sha256", "flagged", "reward", *vitals
        )
    )
    if not rows:
        empty = _Recorded(json=_script_json({"count": 0}), turns=[], unlocked=[], frame_digests=b"")
        return empty, []
    indices, steps, frames, flags, rewards, *series = (
        list(column) for column in zip(*rows, strict=True)
    )
    position = {index: i for i, index in enumerate(indices)}
    # The few turns that failed or unlocked something, each off its partial index.
    errors = sorted(
        position[index] for index in turns.exclude(error="").values_list("index", flat=True)
    )
    unlocks: list[int] = []
    unlocked: list[tuple[str, int, int]] = []
    seen: set[str] = set()
    for index, names in turns.exclude(achievements_unlocked=[]).values_list(
        "index", "achievements_unlocked"
    ):
        unlocks.append(position[index])
        for name in names:
            # Named after the turn whose actions unlocked it (turn 9 unlocks at step 10): the
            # chip links to the turn a reviewer wants to see.
            if name not in seen:
                seen.add(name)
                unlocked.append((name, position[index], index))
    digests = bytes.fromhex("".join(frames))
    columns = {
        "count": len(rows),
        "turn": indices,
        "step": steps,
        # The frames' sha256 digests end to end, base64: 44 bytes a turn instead of 67.
        "frames": base64.b64encode(digests).decode(),
        # Marks as the positions that have them: few turns fail or unlock.
        "errors": errors,
        "unlocks": unlocks,
        "reward": [[i, reward] for i, reward in enumerate(rewards) if reward],
        # One character a turn per vital: the chart draws 0-9.
        "vitals": {
            name: "".join(v if v in _DIGITS else _vital_digit(v) for v in values)
            for name, values in zip(CHART_VITALS, series, strict=True)
        },
    }
    recorded = _Recorded(
        json=_script_json(columns), turns=indices, unlocked=unlocked, frame_digests=digests
    )
    return recorded, [i for i, flag in enumerate(flags) if flag]


# What Django's `json_script` escapes: JSON that can sit inside a <script> element.
_SCRIPT_ESCAPES = {ord(">"): "\\u003E", ord("<"): "\\u003C", ord("&"): "\\u0026"}


def _script_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":")).translate(_SCRIPT_ESCAPES)


_DIGITS = frozenset("0123456789")


def _vital_digit(value: str | None) -> str:
    try:
        return str(min(max(int(value or 0), 0), 9))
    except ValueError:
        return "0"


# What the viewer reads of a turn, in one query.
_VIEWER_FIELDS = (
    "id",
    "index",
    "frame__step",
    "frame__sha256",
    "frame__state",
    "observation_text",
    "request_messages",
    "model_text",
    "reasoning_text",
    "tool_calls",
    "actions",
    "reward",
    "advantage",
    "achievements_unlocked",
    "error",
    "error_kind",
    "finish_reason",
    "text_fallback",
    "prompt_tokens",
    "completion_tokens",
    "latency_ms",
    "retries",
    "flagged",
    "note",
    "truncated",
    # A reviewer's correction, if any (a LEFT JOIN, not a second query).
    "relabel__actions",
    "relabel__reason",
    "relabel__labeled_by__username",
    "relabel__labeled_at",
)


def episode_turn(*, episode_id: int, index: int, whole: bool = False) -> dict[str, Any]:
    """Everything the viewer shows of one turn, its long texts cut for the page unless
    `whole`; Turn.DoesNotExist when the episode has none of that index (or there is no such
    episode).

    Every string in it is model output and is only ever set as text.
    """
    row = Turn.objects.filter(episode_id=episode_id, index=index).values(*_VIEWER_FIELDS).get()
    state = row["frame__state"] or {}
    turn = {
        "id": row["id"],
        "index": row["index"],
        "step": row["frame__step"],
        "frame": row["frame__sha256"],
        "vitals": state.get("vitals", {}),
        "inventory": state.get("inventory", {}),
        "seen": _seen_frames(episode_id, row),
        "observation": row["observation_text"],
        "model_text": row["model_text"],
        "reasoning": row["reasoning_text"],
        "tool_calls": row["tool_calls"],
        "calls": [tool_call_shown(call) for call in row["tool_calls"] or []],
        "actions": row["actions"],
        "reward": row["reward"],
        # A reinforcement-learning run's advantage for the turn (null for any other turn).
        "advantage": row["advantage"],
        "unlocked": row["achievements_unlocked"],
        "error": row["error"],
        "error_kind": row["error_kind"],
        "finish_reason": row["finish_reason"],
        "text_fallback": row["text_fallback"],
        "prompt_tokens": row["prompt_tokens"],
        "completion_tokens": row["completion_tokens"],
        "latency_ms": row["latency_ms"],
        "retries": row["retries"],
        "flagged": row["flagged"],
        "note": row["note"],
        "truncated": row["truncated"],
        "relabel": _relabel(row),
    }
    if whole:
        turn["clipped"] = {}
    else:
        clip_for_page(turn)
    return turn


def episode_advantages(*, episode: Episode) -> tuple[float, float] | None:
    """The lowest and highest advantage a reinforcement-learning run gave the episode's turns
    (GRPO gives each turn its episode's: both the same), or None. Read only for an episode
    with an RL reward: any other has none, and its turns are not read for it."""
    if episode.rl_reward is None:
        return None
    found = Turn.objects.filter(episode_id=episode.id, advantage__isnull=False).aggregate(
        low=Min("advantage"), high=Max("advantage")
    )
    if found["low"] is None:
        return None
    return found["low"], found["high"]


def _seen_frames(episode_id: int, row: dict[str, Any]) -> list[dict[str, Any]]:
    """The frames the turn's request showed the model, by step; a second query only when
    they are not just the turn's own frame."""
    step = row["frame__step"]
    # Baselines send no request: what they "saw" is the turn's own frame.
    seen_steps = request_image_steps(row["request_messages"]) or [step]
    sha_by_step = {step: row["frame__sha256"]}
    if set(seen_steps) - {step}:
        sha_by_step |= dict(
            Frame.objects.filter(episode_id=episode_id, step__in=seen_steps).values_list(
                "step", "sha256"
            )
        )
    return [{"step": s, "frame": sha_by_step.get(s, "")} for s in seen_steps]


# What the viewer receives of each long text; the rest comes from `turn_text` when asked for.
# A model's answer is capped when stored (STUDIO_MAX_ANSWER_BYTES), but the viewer prefetches
# a turn's neighbours: 16 turns of 64 KB texts would be a megabyte for every few key presses.
PAGE_TEXT_CHARS = 2000


# Viewer field -> Turn column.
TURN_TEXT_FIELDS = {
    "observation": "observation_text",
    "model_text": "model_text",
    "reasoning": "reasoning_text",
    "error": "error",
    "tool_calls": "tool_calls",
}


def clip_for_page(turn: dict[str, Any]) -> None:
    """Cut the turn's long texts for the page; `clipped` gives each one's full length."""
    clipped: dict[str, int] = {}
    for name in ("observation", "model_text", "reasoning", "error"):
        value = turn.get(name)
        if isinstance(value, str) and len(value) > PAGE_TEXT_CHARS:
            turn[name] = value[:PAGE_TEXT_CHARS] + "…"
            clipped[name] = len(value)
    calls = turn.get("tool_calls") or []
    shown = turn.get("calls") or []
    if any(len(_arguments(call)) > PAGE_TEXT_CHARS for call in calls) or any(
        len(call["arguments"]) > PAGE_TEXT_CHARS for call in shown
    ):
        # The length of what "Show all" brings: every call's arguments as the viewer shows them.
        clipped["tool_calls"] = sum(len(call["arguments"]) for call in shown)
        turn["tool_calls"] = [_clip_arguments(call) for call in calls]
        turn["calls"] = [_clip_shown(call) for call in shown]
    turn["clipped"] = clipped


def tool_call_shown(call: Any) -> dict[str, Any]:
    """A recorded tool call as the viewer shows it: its arguments as indented JSON when they
    parse, or as the raw text the model sent, marked `malformed`, when they do not.

    The model wrote every string in it: the viewer sets them as text, never as HTML.
    """
    call = call if isinstance(call, dict) else {}
    function = call.get("function") if isinstance(call.get("function"), dict) else {}
    raw = _arguments(call)
    try:
        # NaN and Infinity parse in Python but are no JSON (the tool's schema asks for JSON).
        value = json.loads(raw, parse_constant=_not_json)
    except (ValueError, RecursionError):
        arguments, malformed = raw, True
    else:
        arguments, malformed = json.dumps(value, indent=2, ensure_ascii=False), False
    call_id, name = call.get("id"), function.get("name")
    return {
        "id": call_id if isinstance(call_id, str) else "",
        "name": name if isinstance(name, str) else "",
        "arguments": arguments,
        "malformed": malformed,
    }


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _clip_shown(call: dict[str, Any]) -> dict[str, Any]:
    if len(call["arguments"]) <= PAGE_TEXT_CHARS:
        return call
    return {**call, "arguments": call["arguments"][:PAGE_TEXT_CHARS] + "…"}


def _arguments(call: Any) -> str:
    function = call.get("function") if isinstance(call, dict) else None
    value = function.get("arguments") if isinstance(function, dict) else None
    return value if isinstance(value, str) else ""


def _clip_arguments(call: Any) -> Any:
    arguments = _arguments(call)
    if len(arguments) <= PAGE_TEXT_CHARS:
        return call
    return {
        **call,
        "function": {**call["function"], "arguments": arguments[:PAGE_TEXT_CHARS] + "…"},
    }


def turn_tool_calls_text(calls: Any) -> str:
    # The calls as recorded; the viewer shows them as `tool_call_shown` makes them.
    return json.dumps(calls, indent=2, ensure_ascii=False)


def turn_text(*, turn_id: int, field: str) -> str:
    """One text of a turn in full, as the viewer shows it; KeyError for an unknown field."""
    column = TURN_TEXT_FIELDS[field]
    value = Turn.objects.values_list(column, flat=True).get(id=turn_id)
    if column == "tool_calls":
        return turn_tool_calls_text(value)
    return value or ""


def _relabel(row: dict[str, Any]) -> dict[str, Any] | None:
    if row["relabel__actions"] is None:
        return None
    return {
        "actions": row["relabel__actions"],
        "reason": row["relabel__reason"],
        "by": row["relabel__labeled_by__username"] or "",
        "at": row["relabel__labeled_at"].isoformat(timespec="seconds"),
    }


def request_image_steps(messages: Any) -> list[int]:
    """Frame steps of the image parts in stored request messages, in the order sent."""
    steps: list[int] = []
    if not isinstance(messages, list):
        return steps
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "image_url":
                continue
            image = part.get("image_url")
            step = image.get("frame_step") if isinstance(image, dict) else None
            if isinstance(step, int) and not isinstance(step, bool):
                steps.append(step)
    return steps


def episode_live(*, episode_id: int) -> dict[str, Any]:
    """What the viewer of a playing episode shows of its progress: the episode (its step and
    counters, written with each turn), its batch, the turns recorded, whether it still plays."""
    episode = Episode.objects.select_related("batch").get(id=episode_id)
    return {
        "episode": episode,
        "batch": episode.batch,
        "turns": Turn.objects.filter(episode_id=episode_id).count(),
        "live": episode_plays(episode),
    }


def episode_plays(episode: Episode) -> bool:
    """Whether a worker is (or will be) playing it: not ended, not a person's game."""
    return (
        episode.status in (Episode.Status.PENDING, Episode.Status.RUNNING)
        and episode.batch.policy != RolloutBatch.Policy.HUMAN
    )
