"""Studio JSONL rows to columns: image parts become placeholders, their PNGs `images`."""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
from typing import Any

from curation.hf_export.features import PROBE_METADATA

_DATA_URL = "data:image/"


class HFExportError(ValueError):
    """A row cannot be written (an image that is not a data URL, an unknown part type)."""


def _image_bytes(url: Any) -> bytes:
    if not isinstance(url, str) or not url.startswith(_DATA_URL) or ";base64," not in url:
        raise HFExportError("an image part is not a base64 data URL")
    try:
        return base64.b64decode(url.split(",", 1)[1], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise HFExportError(f"an image data URL does not decode: {exc}") from exc


def _tool_call_text(call: dict[str, Any]) -> str:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        # Malformed arguments stay as the model wrote them: a string, never a repaired object.
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    body = json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>{body}</tool_call>"


def _message(message: dict[str, Any], images: list[bytes], *, tool_calls_as_text: bool) -> dict:
    content = message.get("content")
    parts: list[dict[str, Any]] = []
    if isinstance(content, str):
        parts.append({"type": "text", "text": content})
    elif isinstance(content, list):
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                parts.append({"type": "text", "text": str(part.get("text", ""))})
            elif kind == "image_url":
                images.append(_image_bytes((part.get("image_url") or {}).get("url")))
                parts.append({"type": "image", "text": None})
            elif kind == "image":
                parts.append({"type": "image", "text": None})  # images come in `images`
            else:
                raise HFExportError(f"message part of type {kind!r} has no column here")
    elif content is not None:
        raise HFExportError("message content is neither text nor a list of parts")
    calls = message.get("tool_calls") or []
    if calls and tool_calls_as_text:
        text = "\n".join(_tool_call_text(call) for call in calls)
        if parts and parts[-1]["type"] == "text":
            parts[-1] = {"type": "text", "text": parts[-1]["text"] + "\n" + text}
        else:
            parts.append({"type": "text", "text": text})
        calls = []
    return {
        "role": str(message.get("role", "")),
        "content": parts,
        "tool_calls": [
            {
                "id": call.get("id"),
                "type": call.get("type", "function"),
                "function": {
                    "name": (call.get("function") or {}).get("name"),
                    "arguments": _arguments_text((call.get("function") or {}).get("arguments")),
                },
            }
            for call in calls
        ]
        or None,
    }


def _arguments_text(arguments: Any) -> str | None:
    if arguments is None or isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False)


def _messages(messages: list, images: list[bytes], *, tool_calls_as_text: bool) -> list[dict]:
    return [_message(m, images, tool_calls_as_text=tool_calls_as_text) for m in messages]


def sft_columns(row: dict[str, Any], *, tool_calls_as_text: bool) -> dict[str, Any]:
    """One SFT row (docs/formats.md) as columns: the last message is the completion."""
    images: list[bytes] = []
    messages = row["messages"]
    out: dict[str, Any] = {
        "prompt": _messages(messages[:-1], images, tool_calls_as_text=tool_calls_as_text),
        "completion": _messages(messages[-1:], images, tool_calls_as_text=tool_calls_as_text),
    }
    meta = row.get("metadata")
    if isinstance(meta, dict):
        out.update(
            episode_id=meta.get("episode_id"),
            batch_id=meta.get("batch_id"),
            seed=meta.get("seed"),
            turn=meta.get("turn"),
            model=meta.get("model"),
            policy=meta.get("policy"),
            reward=meta.get("reward"),
            new_achievements=(meta.get("achievements") or {}).get("new_unique") or [],
            cumulative_unique=(meta.get("achievements") or {}).get("cumulative_unique"),
            flagged=meta.get("flagged"),
        )
    return _finish(out, row, images)


def probe_columns(row: dict[str, Any], *, tool_calls_as_text: bool) -> dict[str, Any]:
    """A probe set's question-answer row (`probes.exporting`): an SFT row whose metadata
    says which question it is (`features.PROBE_METADATA`)."""
    images: list[bytes] = []
    messages = row["messages"]
    out: dict[str, Any] = {
        "prompt": _messages(messages[:-1], images, tool_calls_as_text=tool_calls_as_text),
        "completion": _messages(messages[-1:], images, tool_calls_as_text=tool_calls_as_text),
    }
    meta = row.get("metadata")
    if isinstance(meta, dict):
        out.update({name: meta.get(name) for name in PROBE_METADATA})
    return _finish(out, row, images)


def preference_columns(row: dict[str, Any], *, tool_calls_as_text: bool) -> dict[str, Any]:
    """A preference row (`curation.preferences`): placeholders in the prompt, `images` beside."""
    images = [_image_bytes(url) for url in row.get("images") or []]
    seen: list[bytes] = []
    out: dict[str, Any] = {
        "prompt": _messages(row["prompt"], seen, tool_calls_as_text=tool_calls_as_text),
        "chosen": _messages(row["chosen"], seen, tool_calls_as_text=tool_calls_as_text),
        "rejected": _messages(row["rejected"], seen, tool_calls_as_text=tool_calls_as_text),
    }
    if seen:
        raise HFExportError("preference rows carry their images in `images`, not in messages")
    meta = row.get("metadata")
    if isinstance(meta, dict):
        out.update(
            seed=meta.get("seed"),
            turn=meta.get("turn"),
            chosen_episode=meta.get("chosen"),
            rejected_episode=meta.get("rejected"),
        )
    return _finish(out, row, images)


def _finish(out: dict[str, Any], row: dict[str, Any], images: list[bytes]) -> dict[str, Any]:
    placeholders = sum(
        1
        for column in ("prompt", "completion", "chosen", "rejected")
        for message in out.get(column) or []
        for part in message["content"]
        if part["type"] == "image"
    )
    # TRL pairs placeholders with images by position: a mismatch would train on the wrong frame.
    if placeholders != len(images):
        raise HFExportError(f"{placeholders} image placeholders for {len(images)} images")
    out["images"] = [{"bytes": data, "path": None} for data in images]
    out["tools"] = json.dumps(row.get("tools") or [], ensure_ascii=False)
    return out
