"""The export row (docs/formats.md): the one module that knows its shape. Pure, no Django.

A row is built as a string from pieces, not by `json.dumps` of a dict: the system prompt and
the tool schema are serialised once, each frame's image part once (cached while it is
reused by neighbouring rows and history), and only the small per-turn parts are encoded per
row. The result is byte-for-byte what `json.dumps(row, ensure_ascii=False)` gives for the
same dict (default separators, the documented key order), which the tests check: deterministic, and
readable by anything that reads JSON.

History frames (`history_frames=K`): a row rebuilt from a baseline turn (no recorded request)
shows, before its current frame, the frames that the previous K turns of the same episode
showed, oldest first (fewer at the start of an episode). Rows recorded with a request (the
openai policy, imports) are exported exactly as sent: their history is what the model saw.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring
from typing import Any

from curation.row_formats import format_names
from curation.row_formats import row_format as row_format_of
from rollouts.game.tools import INTERACT_MANY_TOOL, SYSTEM_PROMPT, tool_call

PNG_DATA_URL_PREFIX = "data:image/png;base64,"


def dumps(value: Any) -> str:
    """The one JSON encoding of rows: default separators, documented key order, UTF-8 text."""
    return json.dumps(value, ensure_ascii=False)


def _dumps_flat(value: Any) -> str:
    """`dumps(value)`, without the encoder's set-up for a string or a dict of strings.

    Recorded requests are mostly these (roles, text parts); same bytes as `dumps`.
    """
    if type(value) is str:
        return encode_basestring(value)
    if type(value) is dict and all(type(k) is str and type(v) is str for k, v in value.items()):
        fields = (encode_basestring(k) + ": " + encode_basestring(v) for k, v in value.items())
        return "{" + ", ".join(fields) + "}"
    return dumps(value)


DEFAULT_TOOLS: list[dict[str, Any]] = [INTERACT_MANY_TOOL]
SYSTEM_MESSAGE_JSON = dumps({"role": "system", "content": SYSTEM_PROMPT})
_ID_TOKEN = "\x00call-id\x00"


@dataclass(frozen=True, slots=True)
class FrameRef:
    sha256: str
    name: str  # storage name of the PNG


@dataclass(slots=True)  # not frozen: a frozen init cost a tenth of an export's row
class TurnRecord:
    """One turn as the export reads it: plain values. Read-only by convention."""

    episode_id: int
    index: int
    observation_text: str
    request_messages: list[dict[str, Any]]
    model_text: str | None
    tool_calls: list[dict[str, Any]]
    actions: list[str]
    reward: float
    achievements_unlocked: list[str]
    flagged: bool
    frame: FrameRef
    # Actions read from the model's prose: the tool call in the row is inferred, not made.
    text_fallback: bool = False
    # The actions a reviewer says the turn should have taken (None: not relabeled).
    relabel_actions: list[str] | None = None


@dataclass(slots=True)
class EpisodeContext:
    """What a row needs from its episode beyond its own turn."""

    episode_id: int
    batch_id: int
    seed: int
    model: str
    policy: str
    # cumulative unique achievements after each turn index (all turns, filtered or not)
    cumulative: dict[int, int] | RunningCount
    # the frame each turn showed, by turn index (for history frames)
    turn_frames: dict[int, FrameRef] = field(default_factory=dict)
    # frames by step, for recorded requests that name `frame_step`; loaded when first needed
    frames_by_step: Callable[[], dict[int, FrameRef]] | None = None
    tools: list[dict[str, Any]] | None = None
    _steps: dict[int, FrameRef] | None = None
    _meta_prefix: str = ""
    _meta_middle: str = ""

    def frame_at(self, step: int) -> FrameRef:
        if self._steps is None:
            self._steps = self.frames_by_step() if self.frames_by_step else {}
        try:
            return self._steps[step]
        except KeyError:
            raise RowError(
                f"episode {self.episode_id}: the request shows frame {step}, which is not stored"
            ) from None


class RowError(ValueError):
    """A turn cannot be made into a row (e.g. a recorded request names a missing frame)."""


@dataclass(frozen=True, slots=True)
class BuiltRow:
    text: str  # the JSON line, with its newline
    images: tuple[tuple[str, str, str], ...]  # (sha256, role, detail) per image part, in order
    user_has_image: bool
    assistant_has_image: bool
    has_answer: bool
    image_chars: int  # characters of the row that are image data (for token estimates)


def episode_split(*, batch_id: int, seed: int, val_fraction: float) -> str:
    """ "train" or "val" for an episode, from a hash of (batch, seed): stable across exports."""
    if val_fraction <= 0:
        return "train"
    digest = hashlib.sha256(f"{batch_id}:{seed}".encode()).digest()
    return "val" if int.from_bytes(digest[:8], "big") / 2**64 < val_fraction else "train"


def cumulative_unique(unlocked_by_turn: Sequence[tuple[int, Sequence[str]]]) -> dict[int, int]:
    """{turn index: distinct achievements unlocked up to and including that turn}."""
    seen: set[str] = set()
    result: dict[int, int] = {}
    for index, names in sorted(unlocked_by_turn, key=lambda item: item[0]):
        seen.update(names or ())
        result[index] = len(seen)
    return result


class RunningCount:
    """`cumulative_unique` for every turn index, kept as the turns where the count changed.

    Built from the turns that unlocked something only: the export reads those few instead of
    every turn of every episode. `get` reads like the dict's (the count for any index).
    """

    __slots__ = ("_counts", "_indices")

    def __init__(self, unlocked_by_turn: Sequence[tuple[int, Sequence[str]]]) -> None:
        counts = cumulative_unique(unlocked_by_turn)
        self._indices = sorted(counts)
        self._counts = [counts[index] for index in self._indices]

    def get(self, index: int, default: int = 0) -> int:
        at = bisect.bisect_right(self._indices, index)
        return self._counts[at - 1] if at else 0


class RowBuilder:
    """Builds rows of one export. Not thread-safe; one per export."""

    def __init__(
        self,
        *,
        load_png: Callable[[FrameRef], bytes],
        history_frames: int = 0,
        row_format: str = "studio",
        cache_size: int = 64,
    ) -> None:
        declared = row_format_of(row_format)
        self.load_png = load_png
        self.history_frames = history_frames
        self.with_metadata = declared.with_metadata
        # Recorded tools are OpenAI's nested shape: only a flat format rewrites them.
        self._tool_shape = tool_flat if declared.tools == "flat" else (lambda tool: tool)
        self.cache_size = cache_size
        self._images: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._default_tools_json = dumps([self._tool_shape(tool) for tool in DEFAULT_TOOLS])
        self._tools_json: dict[str, str] = {dumps(DEFAULT_TOOLS): self._default_tools_json}
        self._system_json: dict[str, str] = {}
        self._arguments: dict[tuple[str, ...], tuple[str, str]] = {}
        self._row_image_chars = 0

    # -- pieces --------------------------------------------------------------------------

    def image_part(self, frame: FrameRef, extra: dict[str, Any] | None = None) -> str:
        """`{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`."""
        extra_json = _dumps_flat(extra)[1:-1] if extra else ""
        key = (frame.sha256, extra_json)
        part = self._images.get(key)
        if part is not None:
            self._images.move_to_end(key)
            self._row_image_chars += len(part)
            return part
        # Base64 never needs JSON escaping: the data URL goes in as it is.
        encoded = base64.b64encode(self.load_png(frame)).decode("ascii")
        tail = f", {extra_json}" if extra_json else ""
        part = (
            '{"type": "image_url", "image_url": {"url": "'
            + PNG_DATA_URL_PREFIX
            + encoded
            + '"'
            + tail
            + "}}"
        )
        self._images[key] = part
        if len(self._images) > self.cache_size:
            self._images.popitem(last=False)
        self._row_image_chars += len(part)
        return part

    def _tool_calls(self, record: TurnRecord) -> str | None:
        if record.relabel_actions:
            # The correction is the answer: a person's choice, marked in the metadata.
            return self._actions_call(record.relabel_actions, record)
        if record.tool_calls:
            return dumps(record.tool_calls)
        if not record.actions:
            return None
        return self._actions_call(record.actions, record)

    def _actions_call(self, action_list: list[str], record: TurnRecord) -> str:
        actions = tuple(action_list)
        template = self._arguments.get(actions)
        if template is None:
            # One source for the call's shape: rollouts.game.tools.tool_call, with a placeholder id.
            head, _, tail = dumps([tool_call(list(actions), _ID_TOKEN)]).partition(dumps(_ID_TOKEN))
            template = (head, tail)
            self._arguments[actions] = template
        return (
            template[0]
            + '"call_'
            + str(record.episode_id)
            + "_"
            + str(record.index)
            + '"'
            + template[1]
        )

    def _metadata(
        self,
        record: TurnRecord,
        episode: EpisodeContext,
        split: str,
        user_image: bool,
        assistant_image: bool,
    ) -> str:
        if not episode._meta_prefix:
            episode._meta_prefix = (
                '{"episode_id": '
                + str(episode.episode_id)
                + ', "batch_id": '
                + str(episode.batch_id)
                + ', "seed": '
                + str(episode.seed)
                + ', "turn": '
            )
            episode._meta_middle = (
                ', "model": '
                + encode_basestring(episode.model)
                + ', "policy": '
                + encode_basestring(episode.policy)
                + ', "achievements": {"new_unique": '
            )
        return (
            episode._meta_prefix
            + str(record.index)
            + episode._meta_middle
            + (dumps(list(record.achievements_unlocked)) if record.achievements_unlocked else "[]")
            + ', "cumulative_unique": '
            + str(episode.cumulative.get(record.index, len(record.achievements_unlocked)))
            + '}, "reward": '
            + float.__repr__(float(record.reward))
            + ', "user_has_image": '
            + ("true" if user_image else "false")
            + ', "assistant_has_image": '
            + ("true" if assistant_image else "false")
            + ', "has_image": '
            + ("true" if user_image or assistant_image else "false")
            + ', "flagged": '
            + ("true" if record.flagged else "false")
            + ', "split": '
            + encode_basestring(split)
            # A corrected row's tool call is a person's choice, not one read from prose.
            + (
                ', "text_fallback": true'
                if record.text_fallback and not record.relabel_actions
                else ""
            )
            + (
                ', "relabeled": {"original_actions": ' + dumps(list(record.actions)) + "}"
                if record.relabel_actions
                else ""
            )
            + "}"
        )

    def _tools(self, episode: EpisodeContext) -> str:
        # None: the batch kept no tools of its own (it offered the game's). An empty list is
        # an imported file whose rows offered none (probe questions): exported as none.
        if episode.tools is None:
            return self._default_tools_json
        key = dumps(episode.tools)
        if key not in self._tools_json:
            self._tools_json[key] = dumps([self._tool_shape(tool) for tool in episode.tools])
        return self._tools_json[key]

    # -- rows ----------------------------------------------------------------------------

    def row(self, record: TurnRecord, episode: EpisodeContext, *, split: str = "train") -> BuiltRow:
        images: list[tuple[str, str, str]] = []
        self._row_image_chars = 0
        if record.request_messages:
            messages = self._recorded_messages(record, episode, images)
        else:
            messages = self._rebuilt_messages(record, episode, images)
        tool_calls = self._tool_calls(record)
        # A relabeled row's answer is the correction: the model's text is not part of it.
        text = None if record.relabel_actions else record.model_text
        content = "null" if text is None else encode_basestring(text)
        assistant = '{"role": "assistant", "content": ' + content
        if tool_calls is not None:
            assistant += ', "tool_calls": ' + tool_calls
        user_image = any(role == "user" for _, role, _ in images)
        assistant_image = any(role == "assistant" for _, role, _ in images)
        pieces = [
            '{"messages": [',
            messages,
            ", ",
            assistant,
            '}], "tools": ',
            self._tools(episode),
        ]
        if self.with_metadata:
            pieces.append(', "metadata": ')
            pieces.append(self._metadata(record, episode, split, user_image, assistant_image))
        pieces.append("}\n")
        return BuiltRow(
            text="".join(pieces),
            images=tuple(images),
            user_has_image=user_image,
            assistant_has_image=assistant_image,
            has_answer=bool(text) or tool_calls is not None,
            image_chars=self._row_image_chars,
        )

    def _rebuilt_messages(
        self, record: TurnRecord, episode: EpisodeContext, images: list[tuple[str, str, str]]
    ) -> str:
        parts = ['{"type": "text", "text": ' + encode_basestring(record.observation_text) + "}"]
        for back in range(self.history_frames, 0, -1):
            past = episode.turn_frames.get(record.index - back)
            if past is not None:
                parts.append(self.image_part(past))
                images.append((past.sha256, "user", "auto"))
        parts.append(self.image_part(record.frame))
        images.append((record.frame.sha256, "user", "auto"))
        return SYSTEM_MESSAGE_JSON + ', {"role": "user", "content": [' + ", ".join(parts) + "]}"

    def _recorded_messages(
        self, record: TurnRecord, episode: EpisodeContext, images: list[tuple[str, str, str]]
    ) -> str:
        out: list[str] = []
        for message in record.request_messages:
            role = str(message.get("role", ""))
            content = message.get("content")
            if role == "system" and isinstance(content, str) and len(message) == 2:
                cached = self._system_json.get(content)
                if cached is None:
                    cached = self._system_json.setdefault(content, dumps(message))
                out.append(cached)
                continue
            if not isinstance(content, list):
                out.append(dumps(message))
                continue
            parts = []
            for part in content:
                image_url = part.get("image_url") if isinstance(part, dict) else None
                if (
                    isinstance(part, dict)
                    and part.get("type") == "image_url"
                    and isinstance(image_url, dict)
                    and "frame_step" in image_url
                ):
                    frame = episode.frame_at(int(image_url["frame_step"]))
                    extra = {k: v for k, v in image_url.items() if k not in ("frame_step", "url")}
                    parts.append(self.image_part(frame, extra or None))
                    images.append((frame.sha256, role, str(extra.get("detail", "auto"))))
                else:
                    parts.append(_dumps_flat(part))
            fields = []
            for key, value in message.items():
                value_json = (
                    "[" + ", ".join(parts) + "]" if key == "content" else _dumps_flat(value)
                )
                fields.append(encode_basestring(str(key)) + ": " + value_json)
            out.append("{" + ", ".join(fields) + "}")
        return ", ".join(out)


def image_part_frame_step(part: Any) -> int | None:
    """The frame step an image part of a recorded request refers to, if any."""
    if isinstance(part, dict) and part.get("type") == "image_url":
        image_url = part.get("image_url")
        if isinstance(image_url, dict) and isinstance(image_url.get("frame_step"), int):
            return int(image_url["frame_step"])
    return None


# -- provider formats of a stored row ---------------------------------------------------------


def tool_flat(tool: Any) -> Any:
    """synth-ai's tool shape, `{"name", "description", "parameters"}`, from OpenAI's nested one."""
    if isinstance(tool, dict) and isinstance(tool.get("function"), dict) and "name" not in tool:
        return dict(tool["function"])
    return tool


def tool_nested(tool: Any) -> Any:
    """OpenAI's `{"type": "function", "function": {...}}` from a flat tool."""
    if isinstance(tool, dict) and "name" in tool and "function" not in tool:
        return {"type": "function", "function": dict(tool)}
    return tool


def row_for_provider(row: dict[str, Any], *, row_format: str) -> dict[str, Any]:
    """A parsed row (any of this studio's formats) in a provider's format, same turn.

    The format says whether metadata is kept and which tool shape it writes (e.g. `openai`:
    no metadata, nested tools; `synth`: flat tools, metadata kept). Messages are never touched.
    """
    declared = row_format_of(row_format)
    if not declared.for_upload:
        uploadable = format_names(upload=True)
        raise ValueError(f"format {row_format!r} is not one of {uploadable}")
    out = {key: value for key, value in row.items() if key != "metadata"}
    convert = tool_flat if declared.tools == "flat" else tool_nested
    if isinstance(out.get("tools"), list):
        out["tools"] = [convert(tool) for tool in out["tools"]]
    if declared.with_metadata and "metadata" in row:
        out["metadata"] = row["metadata"]
    return out
