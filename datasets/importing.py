"""Imports JSONL rows (ours, synth-ai's SFT rows, plain OpenAI chat rows) as imported turns.

Two passes over the file. The first checks every line (JSON, roles, content parts, tool
calls, every image decoded by Pillow under byte and pixel limits) and collects the errors
with their line numbers; nothing is written unless all lines pass. The second writes, in one
transaction: a `RolloutBatch(policy="imported")`, one `Episode` per episode found (seed = its
position in the import), frames (PNG files by sha256, written only now), turns and a dataset
selecting the batch. Imported turns are then reviewed, flagged and exported like recorded
ones; their request is kept as sent, images referring to stored frames by step.

Episodes: rows whose metadata has `episode_id` (our format) are grouped by
(`batch_id`, `episode_id`), rows with a synth-ai `session_id` by that; any other row is an
episode of its own. Turn indices come from `metadata.turn` when they are distinct within the
episode, else from the order of the lines.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import transaction
from PIL import Image

from datasets.filters import DatasetFilters, ExportOptions
from datasets.jsonl import DEFAULT_TOOLS
from datasets.models import Dataset
from datasets.validation import (
    IMAGE_FORMATS,
    MAX_IMAGE_BYTES,
    ImageError,
    decode_data_url,
    probe_image,
)
from rollouts.crafter_env import ACTIONS
from rollouts.frame_store import FrameStore
from rollouts.models import Episode, Frame, RolloutBatch, Turn
from rollouts.tools import TOOL_NAME

MAX_ERRORS = 100
MAX_LINE_BYTES = 64 * 1024 * 1024
MAX_IMAGES_PER_ROW = 64
ROLES = ("system", "developer", "user", "assistant", "tool")
WRITE_CHUNK = 500


class ImportFailed(Exception):
    """The file has errors; nothing was imported. `errors` hold 'line N: ...' strings."""

    def __init__(self, errors: list[str], total: int) -> None:
        self.errors = errors
        self.total = total
        more = f" (showing the first {len(errors)})" if total > len(errors) else ""
        super().__init__(f"{total} error(s) in the file, nothing imported{more}")


class _LineError(ValueError):
    pass


@dataclass
class _Row:
    """One checked line; images are kept as data until the write pass re-reads them."""

    line: int
    group: tuple
    turn: int | None
    messages: list[dict[str, Any]]  # request messages; image parts hold {"image": k}
    images: list[bytes]  # decoded image bytes, in order of appearance
    model_text: str | None
    tool_calls: list[dict[str, Any]]
    reward: float
    unlocked: list[str]
    flagged: bool
    model: str
    tools: list[dict[str, Any]] | None
    current_image: int | None  # index into images of the frame the turn showed
    observation_text: str


@dataclass
class _Plan:
    lines: int = 0
    groups: dict[tuple, list[tuple[int, int | None]]] = field(default_factory=dict)
    models: set[str] = field(default_factory=set)
    tools: list[dict[str, Any]] | None = None
    tools_line: int = 0
    image_size: int | None = None


def import_file(*, path: str | Path, name: str = "", created_by=None) -> dict[str, Any]:
    """Check, then import all or nothing; returns the summary the command prints."""
    path = Path(path)
    plan = _check(path)
    return _write(path, plan, name=name or path.name, created_by=created_by)


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if raw.strip():
                yield number, raw


def _check(path: Path) -> _Plan:
    plan = _Plan()
    errors: list[str] = []
    total_errors = 0
    for number, raw in _lines(path):
        plan.lines += 1
        try:
            row = _parse(number, raw, keep_images=False)
        except _LineError as exc:
            total_errors += 1
            if len(errors) < MAX_ERRORS:
                errors.append(f"line {number}: {exc}")
            continue
        plan.groups.setdefault(row.group, []).append((number, row.turn))
        if row.model:
            plan.models.add(row.model)
        if row.tools is not None:
            if plan.tools is None:
                plan.tools, plan.tools_line = row.tools, number
            elif row.tools != plan.tools:
                total_errors += 1
                if len(errors) < MAX_ERRORS:
                    errors.append(
                        f"line {number}: its tools differ from line {plan.tools_line}'s; "
                        "import files with different tool sets separately"
                    )
    if not plan.lines and not total_errors:
        errors.append("line 1: the file holds no rows")
        total_errors = 1
    if total_errors:
        raise ImportFailed(errors, total_errors)
    return plan


def _parse(number: int, raw: bytes, *, keep_images: bool) -> _Row:
    if len(raw) > MAX_LINE_BYTES:
        raise _LineError(f"line longer than {MAX_LINE_BYTES} bytes")
    try:
        record = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _LineError(f"not JSON ({exc})") from exc
    if not isinstance(record, dict):
        raise _LineError("not a JSON object")
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _LineError('"messages" must be a non-empty list')
    metadata = record.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise _LineError('"metadata" must be an object')
    tools = record.get("tools")
    if tools is not None and (
        not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)
    ):
        raise _LineError('"tools" must be a list of objects')

    images: list[bytes] = []
    image_roles: list[str] = []
    request: list[dict[str, Any]] = []
    for position, message in enumerate(messages, start=1):
        request.append(_message(position, message, images, image_roles, keep_images))
    answer = request.pop()
    if answer.get("role") != "assistant":
        raise _LineError("the last message must be the assistant's answer")
    if not request:
        raise _LineError("no message comes before the assistant's answer")
    content = answer.get("content")
    if isinstance(content, list):
        if any(p.get("type") != "text" for p in content):
            raise _LineError(
                "the assistant's answer holds an image; answers are text and tool calls"
            )
        content = "".join(p["text"] for p in content)
    tool_calls = answer.get("tool_calls") or []
    if content is None and not tool_calls:
        raise _LineError("the assistant's answer has neither content nor tool calls")

    current = _current_image(request, image_roles)
    observation = _observation_text(request)
    reward = metadata.get("reward", 0.0)
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        raise _LineError("metadata.reward must be a number")
    achievements = metadata.get("achievements")
    unlocked: list[str] = []
    if isinstance(achievements, dict) and achievements.get("new_unique") is not None:
        unlocked = achievements["new_unique"]
        if not isinstance(unlocked, list) or not all(isinstance(a, str) for a in unlocked):
            raise _LineError("metadata.achievements.new_unique must be a list of names")
    turn = metadata.get("turn")
    if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
        turn = None
    flagged = metadata.get("flagged", False)
    if not isinstance(flagged, bool):
        raise _LineError("metadata.flagged must be true or false")
    model = metadata.get("model") or ""
    if not isinstance(model, str):
        raise _LineError("metadata.model must be a string")
    return _Row(
        line=number,
        group=_group(number, metadata),
        turn=turn,
        messages=request,
        images=images,
        model_text=content,
        tool_calls=tool_calls,
        reward=float(reward),
        unlocked=list(unlocked),
        flagged=flagged,
        model=model[:200],
        tools=tools,
        current_image=current,
        observation_text=observation,
    )


def _message(
    position: int,
    message: Any,
    images: list[bytes],
    image_roles: list[str],
    keep_images: bool,
) -> dict[str, Any]:
    where = f"message {position}"
    if not isinstance(message, dict):
        raise _LineError(f"{where} is not an object")
    role = message.get("role")
    if role not in ROLES:
        raise _LineError(f"{where}: role {role!r} is not one of {', '.join(ROLES)}")
    content = message.get("content")
    out = dict(message)
    if isinstance(content, list):
        parts = []
        for n, part in enumerate(content, start=1):
            parts.append(_part(f"{where} part {n}", role, part, images, image_roles, keep_images))
        out["content"] = parts
    elif content is not None and not isinstance(content, str):
        raise _LineError(f"{where}: content must be a string, null or a list of parts")
    elif content is None and role != "assistant":
        raise _LineError(f"{where}: a {role} message needs content")
    if "tool_calls" in message:
        if role != "assistant":
            raise _LineError(f"{where}: only assistant messages have tool calls")
        _check_tool_calls(where, message["tool_calls"])
    return out


def _part(
    where: str,
    role: str,
    part: Any,
    images: list[bytes],
    image_roles: list[str],
    keep_images: bool,
) -> dict[str, Any]:
    if not isinstance(part, dict):
        raise _LineError(f"{where} is not an object")
    kind = part.get("type")
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise _LineError(f"{where}: a text part needs a string 'text'")
        return part
    if kind != "image_url":
        raise _LineError(f"{where}: type {kind!r} is not 'text' or 'image_url'")
    image_url = part.get("image_url")
    if not isinstance(image_url, dict):
        raise _LineError(f"{where}: 'image_url' must be an object with a 'url'")
    if len(images) >= MAX_IMAGES_PER_ROW:
        raise _LineError(f"more than {MAX_IMAGES_PER_ROW} images in one row")
    try:
        data = decode_data_url(image_url.get("url"), max_bytes=MAX_IMAGE_BYTES)
        info = probe_image(data, full_decode=True)
    except ImageError as exc:
        raise _LineError(f"{where}: {exc}") from exc
    if info.format not in IMAGE_FORMATS:
        raise _LineError(f"{where}: image is {info.format}; allowed: {', '.join(IMAGE_FORMATS)}")
    if not (1 <= info.width <= 16384 and 1 <= info.height <= 16384):
        raise _LineError(f"{where}: image of {info.width}x{info.height} pixels")
    images.append(data if keep_images else b"")
    image_roles.append(role)
    extra = {k: v for k, v in image_url.items() if k != "url"}
    return {"type": "image_url", "image_url": {"image": len(images) - 1, **extra}}


def _check_tool_calls(where: str, tool_calls: Any) -> None:
    if not isinstance(tool_calls, list):
        raise _LineError(f"{where}: tool_calls must be a list")
    for n, call in enumerate(tool_calls, start=1):
        function = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or not isinstance(function.get("arguments"), str)
        ):
            raise _LineError(
                f"{where}: tool call {n} needs function.name and function.arguments strings"
            )


def _current_image(request: list[dict[str, Any]], roles: list[str]) -> int | None:
    """The last image of the last user message that has one, else the last image at all."""
    last_any = None
    for message in reversed(request):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for part in reversed(content):
            if part.get("type") == "image_url":
                index = part["image_url"]["image"]
                if message.get("role") == "user":
                    return index
                if last_any is None:
                    last_any = index
    return last_any


def _observation_text(request: list[dict[str, Any]]) -> str:
    for message in reversed(request):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        return "\n".join(p["text"] for p in content if p.get("type") == "text")
    return ""


def _group(number: int, metadata: dict[str, Any]) -> tuple:
    episode = metadata.get("episode_id")
    if isinstance(episode, int | str) and not isinstance(episode, bool):
        return ("episode", str(metadata.get("batch_id", "")), str(episode))
    session = metadata.get("session_id")
    if isinstance(session, int | str) and not isinstance(session, bool):
        return ("session", str(session))
    return ("line", number)


def _actions(tool_calls: list[dict[str, Any]]) -> list[str]:
    actions: list[str] = []
    for call in tool_calls:
        function = call.get("function") or {}
        if function.get("name") != TOOL_NAME:
            continue
        try:
            names = json.loads(function.get("arguments") or "{}").get("actions") or []
        except (ValueError, AttributeError):
            continue
        actions.extend(a for a in names if isinstance(a, str) and a in ACTIONS)
    return actions


def _as_png(data: bytes) -> tuple[bytes, int, int]:
    """Stored PNGs keep their exact bytes (so they export unchanged); others become PNG."""
    with Image.open(io.BytesIO(data)) as image:
        if image.format == "PNG":
            return data, image.width, image.height
        image.load()
        converted = image.convert("RGBA" if "A" in image.getbands() else "RGB")
        buffer = io.BytesIO()
        converted.save(buffer, format="PNG")
        return buffer.getvalue(), image.width, image.height


_PLACEHOLDER_PNG: bytes | None = None


def _placeholder_png() -> bytes:
    """A 1x1 black frame for text-only rows: every turn needs a frame; it is never exported."""
    global _PLACEHOLDER_PNG
    if _PLACEHOLDER_PNG is None:
        buffer = io.BytesIO()
        Image.new("RGB", (1, 1)).save(buffer, format="PNG")
        _PLACEHOLDER_PNG = buffer.getvalue()
    return _PLACEHOLDER_PNG


def _write(path: Path, plan: _Plan, *, name: str, created_by) -> dict[str, Any]:
    store = FrameStore()
    groups = list(plan.groups.items())
    # line -> (episode position, turn index)
    placement: dict[int, tuple[int, int]] = {}
    for position, (_, members) in enumerate(groups):
        turns = [t for _, t in members]
        distinct = all(t is not None for t in turns) and len(set(turns)) == len(turns)
        for order, (line, turn) in enumerate(members):
            placement[line] = (position, turn if distinct else order)
    settings: dict[str, Any] = {"imported_from": path.name, "lines": plan.lines}
    if plan.tools is not None and plan.tools != DEFAULT_TOOLS:
        settings["tools"] = plan.tools
    model = next(iter(plan.models)) if len(plan.models) == 1 else ""
    frames_written = 0
    turns_written = 0
    images_seen = 0
    with transaction.atomic():
        batch = RolloutBatch.objects.create(
            name=name[:200],
            policy=RolloutBatch.Policy.IMPORTED,
            model=model,
            seeds=list(range(len(groups))),
            settings=settings,
            status=RolloutBatch.Status.FINISHED,
            episodes_total=len(groups),
            episodes_finished=len(groups),
            created_by=created_by,
        )
        episodes = Episode.objects.bulk_create(
            Episode(batch=batch, seed=position, status=Episode.Status.FINISHED)
            for position in range(len(groups))
        )
        frames: list[dict[str, Frame]] = [{} for _ in episodes]
        totals = [{"steps": 0, "reward": 0.0, "achievements": {}} for _ in episodes]
        pending_frames: list[Frame] = []
        pending_turns: list[Turn] = []

        def frame_for(position: int, data: bytes) -> Frame:
            nonlocal frames_written
            png, width, height = _as_png(data)
            sha256, storage_name = store.put(png)
            known = frames[position]
            frame = known.get(sha256)
            if frame is None:
                frame = Frame(
                    episode=episodes[position],
                    step=len(known),
                    sha256=sha256,
                    image=storage_name,
                    width=min(width, 32767),
                    height=min(height, 32767),
                    state={},
                )
                known[sha256] = frame
                pending_frames.append(frame)
                frames_written += 1
            return frame

        def flush() -> None:
            Frame.objects.bulk_create(pending_frames)
            Turn.objects.bulk_create(pending_turns)
            pending_frames.clear()
            pending_turns.clear()

        for number, raw in _lines(path):
            row = _parse(number, raw, keep_images=True)
            position, index = placement[number]
            image_frames = [frame_for(position, data) for data in row.images]
            images_seen += len(image_frames)
            if row.current_image is not None:
                frame = image_frames[row.current_image]
            else:
                frame = frame_for(position, _placeholder_png())
            request = [_refer_frames(m, image_frames) for m in row.messages]
            pending_turns.append(
                Turn(
                    episode=episodes[position],
                    index=index,
                    frame=frame,
                    observation_text=row.observation_text,
                    request_messages=request,
                    model_text=row.model_text,
                    tool_calls=row.tool_calls,
                    actions=_actions(row.tool_calls),
                    reward=row.reward,
                    achievements_unlocked=row.unlocked,
                    flagged=row.flagged,
                )
            )
            total = totals[position]
            total["steps"] += 1
            total["reward"] += row.reward
            for achievement in row.unlocked:
                total["achievements"].setdefault(achievement, index)
            turns_written += 1
            if len(pending_turns) >= WRITE_CHUNK:
                flush()
        flush()
        for episode, total in zip(episodes, totals, strict=True):
            episode.steps = total["steps"]
            episode.total_reward = total["reward"]
            episode.achievements = total["achievements"]
            episode.achievement_count = len(total["achievements"])
        Episode.objects.bulk_update(
            episodes, ["steps", "total_reward", "achievements", "achievement_count"]
        )
        RolloutBatch.objects.filter(id=batch.id).update(
            step_limit=max([1, *(t["steps"] for t in totals)])
        )
        dataset = Dataset.objects.create(
            name=name[:200],
            description=f"Imported from {path.name}",
            filters=DatasetFilters(batches=(batch.id,)).to_json(),
            export_options=ExportOptions().to_json(),
            created_by=created_by,
        )
    return {
        "dataset_id": dataset.id,
        "batch_id": batch.id,
        "lines": plan.lines,
        "episodes": len(episodes),
        "turns": turns_written,
        "frames": frames_written,
        "images": images_seen,
    }


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
