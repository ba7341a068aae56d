"""A hostile or broken model answer is a bad turn, never a lost episode.

Each answer comes from a real local server through the real client library and is recorded
by the real recorder into PostgreSQL: the turn is kept and the episode plays on.
"""

from __future__ import annotations

import json

import pytest

from rollouts import selectors
from rollouts.models import Episode, RolloutBatch, Turn
from rollouts.tests import openai_server as replies
from rollouts.tests.helpers import record_batch

LONG_FINISH = "stop_because_the_server_says_so_for_a_very_long_reason"  # 54 characters


def play(server, **options) -> RolloutBatch:
    options.setdefault("seeds", (3,))
    options.setdefault("steps", 3)
    return record_batch(policy="openai", model="test-vlm", base_url=server.url, **options)


def with_fields(reply: replies.Reply, **fields) -> replies.Reply:
    for name, value in fields.items():
        setattr(reply, name, value)
    return reply


def completion(message: dict, *, finish_reason="tool_calls", usage=None) -> dict:
    return {
        "id": "chatcmpl-x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": usage or {"prompt_tokens": 1, "completion_tokens": 1},
    }


def good_call(arguments='{"actions": ["do"]}', name="interact_many") -> dict:
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}


HOSTILE = [
    # (name, reply for turn 1, error kind)
    (
        "finish_reason over 40 characters",
        with_fields(replies.tool_call("do"), finish_reason=LONG_FINISH),
        "truncated_answer",
    ),
    (
        "NUL in the text",
        with_fields(replies.tool_call("do"), content="I will\x00 chop"),
        "invalid_text",
    ),
    (
        "NUL in the tool arguments",
        replies.raw_arguments('{"actions": ["do"], "why": "\x00"}'),
        "invalid_text",
    ),
    (
        "lone surrogate in the reasoning",
        with_fields(replies.tool_call("do"), reasoning="tree \ud800 ahead"),
        "invalid_text",
    ),
    (
        "lone surrogate in the tool name",
        replies.tool_call("do", name="interact_\udfffmany"),
        "invalid_text",
    ),
    ("200 whose body is not JSON", replies.raw(b"<html>Bad gateway</html>"), "invalid_response"),
    (
        "200 HTML",
        replies.raw(b"<html>oops</html>", content_type="text/html"),
        "invalid_response",
    ),
    ("200 of invalid UTF-8", replies.raw(b'{"choices": "\xff\xfe'), "invalid_response"),
    ("JSON nested 100,000 deep", replies.raw(b"[" * 100_000), "invalid_response"),
    ("a JSON list", replies.raw(b"[1, 2]"), "invalid_response"),
    (
        "choices not a list",
        with_fields(replies.tool_call("do"), payload={"choices": "many"}),
        "invalid_response",
    ),
    (
        "a choice without a message",
        with_fields(replies.tool_call("do"), payload={"choices": [{"message": None}]}),
        "invalid_response",
    ),
    (
        "tool calls not a list",
        with_fields(
            replies.tool_call("do"), payload=completion({"role": "assistant", "tool_calls": 7})
        ),
        "invalid_response",
    ),
    (
        "tool call of the wrong shape",
        with_fields(
            replies.tool_call("do"),
            payload=completion({"role": "assistant", "tool_calls": ["do", None]}),
        ),
        "wrong_tool",
    ),
    (
        "arguments that are not a string",
        with_fields(
            replies.tool_call("do"),
            payload=completion(
                {"role": "assistant", "tool_calls": [good_call(arguments={"actions": 5})]}
            ),
        ),
        "malformed_arguments",
    ),
    (
        "300 tool calls",
        with_fields(
            replies.tool_call("do"),
            payload=completion({"role": "assistant", "tool_calls": [good_call()] * 300}),
        ),
        "truncated_answer",
    ),
    ("an answer over the body cap", replies.huge(200 * 1024 * 1024), "answer_too_large"),
    ("a gzip bomb", replies.huge(200 * 1024 * 1024, gzip=True), "answer_too_large"),
    (
        "an encoding not asked for",
        with_fields(replies.raw(b"{}"), headers={"Content-Encoding": "br"}),
        "invalid_response",
    ),
    (
        "a corrupt gzip body",
        with_fields(replies.raw(b"not gzip at all"), headers={"Content-Encoding": "gzip"}),
        "invalid_response",
    ),
    (
        "an error body over the body cap",
        replies.raw(b'{"error": {"message": "' + b"x" * 3_000_000 + b'"}}', status=500),
        "answer_too_large",
    ),
]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("script", "kind"), [(reply, kind) for _, reply, kind in HOSTILE], ids=[h[0] for h in HOSTILE]
)
def test_it_records_a_hostile_answer_as_a_bad_turn_and_plays_on(
    chat_server, settings, script, kind
):
    settings.STUDIO_MAX_RESPONSE_BYTES = 1024 * 1024
    chat_server.script(replies.tool_call("move_right"), script)
    batch = play(chat_server)
    episode = batch.episodes.get()
    assert episode.status == Episode.Status.FINISHED, episode.error
    turns = list(episode.turns.order_by("index"))
    assert len(turns) == 3
    bad = turns[1]
    assert (bad.error_kind, bad.actions) == (kind, ["noop"]), bad.error
    assert [turns[0].error_kind, turns[2].error_kind] == ["", ""]
    assert (episode.bad_outputs, episode.model_errors) == (1, 0)
    assert batch.status == RolloutBatch.Status.FINISHED
    stored = json.dumps(
        list(Turn.objects.filter(id=bad.id).values()), default=str, ensure_ascii=False
    )
    assert "\x00" not in stored and "\\u0000" not in stored
    stored.encode("utf-8")  # no lone surrogate: it would not encode
    assert len(stored.encode()) < 200_000


@pytest.mark.django_db
def test_it_keeps_what_it_cleaned_and_says_what_it_cut(chat_server, settings):
    settings.STUDIO_MAX_ANSWER_BYTES = 1000
    chat_server.script(
        with_fields(replies.tool_call("do"), finish_reason=LONG_FINISH),
        with_fields(replies.tool_call("do"), content="look\x00 a tree \ud800!"),
        with_fields(replies.tool_call("do"), content="é" * 800),  # 1,600 bytes of UTF-8
    )
    first, second, third = play(chat_server).episodes.get().turns.order_by("index")
    assert first.finish_reason == LONG_FINISH[:40]
    assert first.truncated == {"finish_reason": 54}
    assert "finish_reason (54 bytes)" in first.error
    # The tool call itself was fine: it is kept as the model sent it.
    assert json.loads(first.tool_calls[0]["function"]["arguments"]) == {"actions": ["do"]}
    assert second.model_text == "look a tree \ufffd!"
    assert "model_text" in second.error and second.truncated == {}
    assert third.model_text == "é" * 500  # cut at 1,000 bytes, never inside a character
    assert third.truncated == {"model_text": 1600}


@pytest.mark.django_db
def test_it_clamps_token_counts_out_of_range(chat_server):
    chat_server.script(
        with_fields(
            replies.tool_call("do"),
            payload=completion(
                {"role": "assistant", "tool_calls": [good_call()]},
                usage={"prompt_tokens": 10**30, "completion_tokens": -5},
            ),
        ),
        with_fields(
            replies.tool_call("do"),
            payload=completion(
                {"role": "assistant", "tool_calls": [good_call()]},
                usage={"prompt_tokens": "many", "completion_tokens": 1e999},
            ),
        ),
    )
    first, second = play(chat_server, steps=2).episodes.get().turns.order_by("index")
    assert (first.prompt_tokens, first.completion_tokens) == (2**31 - 1, 0)
    assert (second.prompt_tokens, second.completion_tokens) == (0, 0)
    assert first.actions == second.actions == ["do"] and first.error_kind == ""


@pytest.mark.django_db
def test_it_stops_reading_an_answer_at_the_cap(chat_server, settings):
    settings.STUDIO_MAX_RESPONSE_BYTES = 1024 * 1024
    chat_server.script(replies.huge(500 * 1024 * 1024))
    turn = play(chat_server, steps=1).episodes.get().turns.get()
    assert turn.error_kind == "answer_too_large"
    assert "over 1048576 bytes" in turn.error
    # The server could write 500 MB; the client hung up after about the cap (plus what the
    # sockets' buffers took in).
    assert chat_server.bytes_sent < 32 * 1024 * 1024


@pytest.mark.django_db
def test_it_cleans_and_redacts_what_an_error_echoes(chat_server, chat_endpoint):
    # A 400 is not retried; its message is the server's, NUL, surrogate and key echo included.
    message = "bad\x00 request \ud800 for key sk-test-e******6789 (sk-test-endpoint-key-0123456789)"
    chat_server.script(replies.tool_call("noop"), replies.status(400, message=message))
    batch = record_batch(
        policy="openai",
        model="test-vlm",
        endpoint=chat_endpoint.name,
        base_url=chat_endpoint.base_url,
        seeds=(3,),
        steps=2,
    )
    turn = batch.episodes.get().turns.get(index=1)
    assert turn.error_kind == "http_400"
    assert turn.error.startswith("HTTP 400: ")
    assert turn.error.endswith(" bad request \ufffd for key [key] ([key])")


@pytest.mark.django_db
def test_it_redacts_a_masked_key_in_the_batch_error(chat_server, chat_endpoint):
    chat_server.default = replies.status(
        401, message="Incorrect API key provided: sk-test-****************6789."
    )
    batch = record_batch(
        policy="openai",
        model="test-vlm",
        endpoint=chat_endpoint.name,
        base_url=chat_endpoint.base_url,
        seeds=(3,),
        steps=2,
    )
    assert batch.status == RolloutBatch.Status.FAILED
    assert "Incorrect API key provided: [key]." in batch.error
    assert "6789" not in batch.error and "sk-test" not in batch.error
    assert selectors.batch_summary(batch=batch)["failed"] == 1
