"""The request of one turn: what is sent (base64 images) and what is stored (frame refs)."""

from __future__ import annotations

import base64
from typing import Any

from rollouts.policies.base import Observation
from rollouts.rollout_settings import RolloutSettings
from rollouts.tools import system_prompt


def build_messages(
    settings: RolloutSettings, observation: Observation
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(messages to store, messages to send): identical but for the image parts."""
    with_image = settings.observation_mode in ("image_text", "image")
    with_text = settings.observation_mode in ("image_text", "text")
    detail = settings.image_detail
    pngs = {observation.frame_step: observation.png}
    parts: list[dict[str, Any]] = []

    def image(frame_step: int) -> dict[str, Any]:
        return {"type": "image_url", "image_url": {"frame_step": frame_step, "detail": detail}}

    history = observation.history[-settings.history_frames :] if settings.history_frames else ()
    if history:
        lines = [f"Your last {len(history)} turns, oldest first:"]
        lines += [
            f"- step {past.frame_step}: {', '.join(past.actions) or '(no action)'}"
            for past in history
        ]
        parts.append({"type": "text", "text": "\n".join(lines)})
        if with_image:
            for past in history:
                pngs[past.frame_step] = past.png
                parts.append({"type": "text", "text": f"Frame at step {past.frame_step}:"})
                parts.append(image(past.frame_step))
    if with_text:
        parts.append({"type": "text", "text": observation.text})
    else:
        parts.append({"type": "text", "text": "The current frame:"})
    if with_image:
        parts.append(image(observation.frame_step))
    # One prompt for the whole batch (RolloutBatch.system_prompt is exactly what was sent).
    prompt = system_prompt(
        observation_mode=settings.observation_mode, history_frames=settings.history_frames
    )
    stored = [
        {"role": "system", "content": prompt},
        {"role": "user", "content": parts},
    ]
    return stored, _with_image_data(stored, pngs)


def _with_image_data(
    messages: list[dict[str, Any]], pngs: dict[int, bytes]
) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            content = [_image_part_with_data(part, pngs) for part in content]
        sent.append({**message, "content": content})
    return sent


def _image_part_with_data(part: dict[str, Any], pngs: dict[int, bytes]) -> dict[str, Any]:
    if part.get("type") != "image_url":
        return part
    ref = part["image_url"]
    data = base64.b64encode(pngs[ref["frame_step"]]).decode("ascii")
    return {
        "type": "image_url",
        "image_url": {"url": f"data:image/png;base64,{data}", "detail": ref["detail"]},
    }
