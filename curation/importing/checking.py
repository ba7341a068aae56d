"""Pass one of an import: every line checked, errors collected with line numbers."""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from curation.importing.errors import MAX_ERRORS, ImportFailed
from curation.importing.errors import LineError as _LineError
from curation.importing.existing import check_existing, text_sha
from curation.importing.plan import Plan
from curation.importing.values import load_json
from curation.validation import (
    IMAGE_FORMATS,
    MAX_IMAGE_BYTES,
    ImageError,
    decode_data_url,
    probe_image,
)
from rollouts.game.crafter_env import ACTIONS
from rollouts.game.tools import TOOL_NAME

MAX_LINE_BYTES = 64 * 1024 * 1024
MAX_IMAGES_PER_ROW = 64
ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_TURN = 2**31 - 1
MAX_NAME_CHARS = 200
MAX_ACHIEVEMENTS = 64
# What OpenAI's image_url part may hold; anything else would not survive the export.
IMAGE_URL_KEYS = ("url", "detail")
IMAGE_DETAILS = ("auto", "low", "high")
_SURROGATE = re.compile("[\ud800-\udfff]")


class LineTooLong(Exception):
    """A line over the limit, found while reading it; the rest of it was skipped unread."""


@dataclass
class Row:
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
    # sha256 of each image's bytes as sent (an export's PNGs are the stored frames' bytes)
    image_sha256: list[str] = field(default_factory=list)
    # (batch_id, episode_id, turn) when the row says it came from this studio
    origin: tuple[int, int, int] | None = None


Progress = Callable[[int], None]  # bytes read so far


def file_lines(
    path: Path,
    *,
    max_bytes: int = MAX_LINE_BYTES,
    progress: Progress | None = None,
    digest: Any = None,
) -> Iterator[tuple[int, bytes | LineTooLong]]:
    """Non-blank lines; one over `max_bytes` is refused while it is read (bounded memory).

    `digest` (a hashlib object) is fed every byte of the file, skipped ones included.
    """
    feed = digest.update if digest is not None else (lambda _: None)
    read = 0
    with open(path, "rb") as fh:
        number = 0
        while True:
            raw = fh.readline(max_bytes + 1)
            if not raw:
                return
            number += 1
            read += len(raw)
            feed(raw)
            if len(raw) > max_bytes and not raw.endswith(b"\n"):
                raw = b""  # let the memory go before skipping the rest of the line
                while True:
                    rest = fh.readline(1024 * 1024)
                    read += len(rest)
                    feed(rest)
                    if not rest or rest.endswith(b"\n"):
                        break
                    if progress is not None:
                        progress(read)
                yield number, LineTooLong(f"line longer than {max_bytes} bytes")
            elif raw.strip():
                yield number, raw
            if progress is not None:
                progress(read)


def check_file(
    path: Path,
    *,
    skip_existing: bool = False,
    max_line_bytes: int = MAX_LINE_BYTES,
    progress: Progress | None = None,
) -> Plan:
    plan = Plan()
    errors: list[str] = []
    total_errors = 0
    digest = hashlib.sha256()
    for number, raw in file_lines(path, max_bytes=max_line_bytes, progress=progress, digest=digest):
        plan.lines += 1
        try:
            if isinstance(raw, LineTooLong):
                raise _LineError(str(raw))
            row = parse_line(number, raw, keep_images=False)
        except _LineError as exc:
            total_errors += 1
            if len(errors) < MAX_ERRORS:
                errors.append(f"line {number}: {exc}")
            continue
        plan.groups.setdefault(row.group, []).append((number, row.turn))
        if row.origin is not None:
            image = row.image_sha256[row.current_image] if row.current_image is not None else ""
            plan.origins[number] = (*row.origin, text_sha(row.model_text), image)
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
    plan.sha256 = digest.hexdigest()
    plan.skip_existing = skip_existing
    check_existing(plan, skip_existing=skip_existing)
    return plan


def parse_line(number: int, raw: bytes, *, keep_images: bool) -> Row:
    """One line checked in order: the record's shape, its messages, the assistant's answer,
    then the metadata; the first problem found is the line's error."""
    messages, metadata, tools = _record_parts(raw)
    images: list[bytes] = []
    image_roles: list[str] = []
    image_sha256: list[str] = []
    request: list[dict[str, Any]] = []
    for position, message in enumerate(messages, start=1):
        request.append(_message(position, message, images, image_roles, image_sha256, keep_images))
    content, tool_calls = _answer(request)
    current = _current_image(request, image_roles)
    observation = _observation_text(request)
    meta = _checked_metadata(metadata)
    return Row(
        line=number,
        group=_group(number, metadata),
        turn=meta.turn,
        messages=request,
        images=images,
        model_text=content,
        tool_calls=tool_calls,
        reward=meta.reward,
        unlocked=meta.unlocked,
        flagged=meta.flagged,
        model=meta.model,
        tools=tools,
        current_image=current,
        observation_text=observation,
        image_sha256=image_sha256,
        origin=meta.origin,
    )


def _record_parts(raw: bytes) -> tuple[list[Any], dict[str, Any], list[dict[str, Any]] | None]:
    """The line's messages, metadata and tools, each of the right kind."""
    if len(raw) > MAX_LINE_BYTES:
        raise _LineError(f"line longer than {MAX_LINE_BYTES} bytes")
    record = load_json(raw)
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
    return messages, metadata, tools


def _answer(request: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """Take the assistant's answer off the end of `request`: its text and its tool calls."""
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
    return content, tool_calls


@dataclass
class _Metadata:
    reward: float
    unlocked: list[str]
    turn: int | None
    flagged: bool
    model: str
    origin: tuple[int, int, int] | None  # (batch_id, episode_id, turn) when all three are ids


def _checked_metadata(metadata: dict[str, Any]) -> _Metadata:
    reward = metadata.get("reward", 0.0)
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        raise _LineError("metadata.reward must be a number")
    unlocked = _unlocked(metadata)
    turn = metadata.get("turn")
    if turn is not None and (
        isinstance(turn, bool) or not isinstance(turn, int) or not 0 <= turn <= MAX_TURN
    ):
        raise _LineError(f"metadata.turn must be a whole number from 0 to {MAX_TURN}")
    flagged = metadata.get("flagged", False)
    if not isinstance(flagged, bool):
        raise _LineError("metadata.flagged must be true or false")
    model = metadata.get("model") or ""
    if not isinstance(model, str) or len(model) > MAX_NAME_CHARS:
        raise _LineError(f"metadata.model must be a string of at most {MAX_NAME_CHARS} characters")
    origin = None
    ids = (metadata.get("batch_id"), metadata.get("episode_id"), turn)
    if all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        origin = ids
    return _Metadata(
        reward=float(reward),
        unlocked=unlocked,
        turn=turn,
        flagged=flagged,
        model=model,
        origin=origin,  # type: ignore[arg-type]
    )


def _unlocked(metadata: dict[str, Any]) -> list[str]:
    """metadata.achievements.new_unique: the achievements this turn unlocked."""
    achievements = metadata.get("achievements")
    unlocked: list[str] = []
    if isinstance(achievements, dict) and achievements.get("new_unique") is not None:
        unlocked = achievements["new_unique"]
        if not isinstance(unlocked, list) or not all(isinstance(a, str) for a in unlocked):
            raise _LineError("metadata.achievements.new_unique must be a list of names")
    if len(unlocked) > MAX_ACHIEVEMENTS or any(len(a) > MAX_NAME_CHARS for a in unlocked):
        raise _LineError(
            f"metadata.achievements.new_unique: at most {MAX_ACHIEVEMENTS} names of at most "
            f"{MAX_NAME_CHARS} characters"
        )
    return list(unlocked)


def _message(
    position: int,
    message: Any,
    images: list[bytes],
    image_roles: list[str],
    image_sha256: list[str],
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
            parts.append(
                _part(
                    f"{where} part {n}", role, part, images, image_roles, image_sha256, keep_images
                )
            )
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
    image_sha256: list[str],
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
    unknown = sorted(set(image_url) - set(IMAGE_URL_KEYS))
    if unknown:
        raise _LineError(
            f"{where}: image_url holds {', '.join(repr(k[:40]) for k in unknown[:5])}; "
            f"only {' and '.join(IMAGE_URL_KEYS)} are allowed"
        )
    if "detail" in image_url and image_url["detail"] not in IMAGE_DETAILS:
        raise _LineError(f"{where}: image_url.detail must be one of {', '.join(IMAGE_DETAILS)}")
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
    image_sha256.append(hashlib.sha256(data).hexdigest())
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


def actions_of(tool_calls: list[dict[str, Any]]) -> list[str]:
    actions: list[str] = []
    for call in tool_calls:
        function = call.get("function") or {}
        if function.get("name") != TOOL_NAME:
            continue
        try:
            names = json.loads(function.get("arguments") or "{}").get("actions") or []
        except (ValueError, AttributeError, RecursionError):
            continue
        actions.extend(a for a in names if isinstance(a, str) and a in ACTIONS)
    return actions


def as_png(data: bytes) -> tuple[bytes, int, int]:
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


def placeholder_png() -> bytes:
    """A 1x1 black frame for text-only rows: every turn needs a frame; it is never exported."""
    global _PLACEHOLDER_PNG
    if _PLACEHOLDER_PNG is None:
        buffer = io.BytesIO()
        Image.new("RGB", (1, 1)).save(buffer, format="PNG")
        _PLACEHOLDER_PNG = buffer.getvalue()
    return _PLACEHOLDER_PNG
