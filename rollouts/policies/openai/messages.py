"""The request of one turn: what is sent (base64 images) and what is stored (frame refs)."""

from __future__ import annotations

import base64
import functools
from typing import Any

from rollouts.game.tools import system_prompt
from rollouts.policies.base import Observation
from rollouts.rollout_settings import RolloutSettings


class ImageUrls:
    """Each frame's `data:` URL, encoded once and kept while history may show it again.

    With `history_frames` K, a frame goes out in K + 1 requests; its base64 text is the same
    each time. Kept per episode (one per policy), for the last `keep` frames only.
    """

    def __init__(self, *, keep: int) -> None:
        self.keep = max(1, keep)
        self._urls: dict[int, tuple[bytes, str]] = {}

    def url(self, frame_step: int, png: bytes) -> str:
        cached = self._urls.get(frame_step)
        # The same frame step with other bytes (a replayed episode) is encoded afresh.
        if cached is not None and (cached[0] is png or cached[0] == png):
            return cached[1]
        url = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
        self._urls[frame_step] = (png, url)
        while len(self._urls) > self.keep:
            del self._urls[next(iter(self._urls))]  # the oldest: dicts keep insertion order
        return url


@functools.lru_cache(maxsize=32)
def _system_prompt(observation_mode: str, history_frames: int) -> str:
    # The same text for every turn of a batch: built once per process, not once per call.
    return system_prompt(observation_mode=observation_mode, history_frames=history_frames)


def build_messages(
    settings: RolloutSettings, observation: Observation, *, urls: ImageUrls | None = None
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
    prompt = _system_prompt(settings.observation_mode, settings.history_frames)
    stored = [
        {"role": "system", "content": prompt},
        {"role": "user", "content": parts},
    ]
    return stored, _with_image_data(stored, pngs, urls or ImageUrls(keep=len(pngs)))


def _with_image_data(
    messages: list[dict[str, Any]], pngs: dict[int, bytes], urls: ImageUrls
) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            content = [_image_part_with_data(part, pngs, urls) for part in content]
        sent.append({**message, "content": content})
    return sent


def _image_part_with_data(
    part: dict[str, Any], pngs: dict[int, bytes], urls: ImageUrls
) -> dict[str, Any]:
    if part.get("type") != "image_url":
        return part
    ref = part["image_url"]
    step = ref["frame_step"]
    return {
        "type": "image_url",
        "image_url": {"url": urls.url(step, pngs[step]), "detail": ref["detail"]},
    }
