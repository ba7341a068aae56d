"""The columns, declared once: their Arrow types and the `datasets` feature metadata."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa


def _value(dtype: str) -> dict[str, Any]:
    return {"dtype": dtype, "_type": "Value"}


def _list(feature: Any) -> dict[str, Any]:
    return {"feature": feature, "_type": "List"}


_PART = {"type": _value("string"), "text": _value("string")}
_TOOL_CALL = {
    "id": _value("string"),
    "type": _value("string"),
    "function": {"name": _value("string"), "arguments": _value("string")},
}
_MESSAGE = {"role": _value("string"), "content": _list(_PART), "tool_calls": _list(_TOOL_CALL)}
_MESSAGES = _list(_MESSAGE)
_IMAGES = _list({"_type": "Image"})

SFT_METADATA = {
    "episode_id": _value("int64"),
    "batch_id": _value("int64"),
    "seed": _value("int64"),
    "turn": _value("int64"),
    "model": _value("string"),
    "policy": _value("string"),
    "reward": _value("float64"),
    "new_achievements": _list(_value("string")),
    "cumulative_unique": _value("int64"),
    "flagged": _value("bool"),
}
_OUTCOME = {
    "episode_id": _value("int64"),
    "batch_id": _value("int64"),
    "sample": _value("int64"),
    "unique_achievements": _value("int64"),
    "reward": _value("float64"),
}
PREFERENCE_METADATA = {
    "seed": _value("int64"),
    "turn": _value("int64"),
    "chosen_episode": _OUTCOME,
    "rejected_episode": _OUTCOME,
}


# A probe set's question-answer rows (`probes.exporting`): which question, and its answer.
PROBE_METADATA = {
    "probe_set_id": _value("int64"),
    "question": _value("int64"),
    "kind": _value("string"),
    "subject": _value("string"),
    "choices": _list(_value("string")),
    "answer": _value("string"),
    "episode_id": _value("int64"),
    "batch_id": _value("int64"),
    "seed": _value("int64"),
    "frame_step": _value("int64"),
    "model": _value("string"),
    "policy": _value("string"),
}


def features_for(kind: str, *, with_metadata: bool) -> dict[str, Any]:
    if kind == "probe":
        columns = {"images": _IMAGES, "prompt": _MESSAGES, "completion": _MESSAGES}
        metadata = PROBE_METADATA
    elif kind == "preference":
        columns = {"images": _IMAGES, "prompt": _MESSAGES, "chosen": _MESSAGES}
        columns["rejected"] = _MESSAGES
        metadata = PREFERENCE_METADATA
    else:
        columns = {"images": _IMAGES, "prompt": _MESSAGES, "completion": _MESSAGES}
        metadata = SFT_METADATA
    columns["tools"] = _value("string")
    if with_metadata:
        columns.update(metadata)
    return columns


def _arrow_type(feature: Any) -> pa.DataType:
    if isinstance(feature, dict) and feature.get("_type") == "Value":
        return {
            "string": pa.string(),
            "int64": pa.int64(),
            "float64": pa.float64(),
            "bool": pa.bool_(),
        }[feature["dtype"]]
    if isinstance(feature, dict) and feature.get("_type") == "List":
        return pa.list_(_arrow_type(feature["feature"]))
    if isinstance(feature, dict) and feature.get("_type") == "Image":
        return pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    return pa.struct([(name, _arrow_type(sub)) for name, sub in feature.items()])


def arrow_schema(features: dict[str, Any]) -> pa.Schema:
    metadata = {"huggingface": json.dumps({"info": {"features": features}})}
    return pa.schema([(n, _arrow_type(f)) for n, f in features.items()], metadata=metadata)
