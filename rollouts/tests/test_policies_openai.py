"""The `openai` policy against a real chat-completions server, through the real `openai` client,
recorded by the real recorder into PostgreSQL."""

from __future__ import annotations

import base64
import io
import json
import socket

import pytest
from django.core.management import CommandError, call_command

from rollouts import selectors
from rollouts.game.text_actions import actions_from_text
from rollouts.game.tools import INTERACT_MANY_TOOL
from rollouts.models import Episode, RolloutBatch, Turn
from rollouts.policies.openai import retry_after_seconds
from rollouts.recording import services
from rollouts.recording.frame_store import FrameStore
from rollouts.rollout_settings import RolloutSettings
from rollouts.tests import openai_server as replies
from rollouts.tests.helpers import BATCH_ENDS, record_batch
from studio.testing import wait_for_row

DATA_URL_PREFIX = "data:image/png;base64,"


def play(server, **options) -> RolloutBatch:
    options.setdefault("seeds", (3,))
    options.setdefault("steps", 3)
    return record_batch(policy="openai", model="test-vlm", base_url=server.url, **options)


def image_parts(content: list[dict]) -> list[dict]:
    return [part for part in content if part["type"] == "image_url"]


def sent_png(part: dict) -> bytes:
    url = part["image_url"]["url"]
    assert url.startswith(DATA_URL_PREFIX)
    return base64.b64decode(url[len(DATA_URL_PREFIX) :])


def stored_png(episode: Episode, step: int) -> bytes:
    return FrameStore().read(episode.frames.get(step=step).image.name)


# --- what is sent, what is stored ---------------------------------------------------------


@pytest.mark.django_db
def test_it_sends_exactly_the_stored_frame_the_tool_and_tool_choice_required(chat_server):
    chat_server.script(
        replies.tool_call("move_right", "move_down"),
        replies.tool_call("do"),
        replies.tool_call("noop"),
    )
    batch = play(chat_server, steps=4, temperature=0.3, max_tokens=200, image_detail="low")
    episode = batch.episodes.get()
    assert episode.status == Episode.Status.FINISHED
    turns = list(episode.turns.select_related("frame").order_by("index"))
    assert [t.actions for t in turns] == [["move_right", "move_down"], ["do"], ["noop"]]
    assert len(chat_server.requests) == 3
    for turn, received in zip(turns, chat_server.requests, strict=True):
        body = received.body
        assert body["model"] == "test-vlm"
        assert body["tools"] == [json.loads(json.dumps(INTERACT_MANY_TOOL))]
        assert body["tool_choice"] == "required"
        assert body["temperature"] == 0.3 and body["max_tokens"] == 200
        system, user = body["messages"]
        assert system["role"] == "system" and "interact_many" in system["content"]
        assert user["content"][0] == {"type": "text", "text": turn.observation_text}
        (image,) = image_parts(user["content"])
        assert image["image_url"]["detail"] == "low"
        assert sent_png(image) == stored_png(episode, turn.frame.step)
        # What is stored is the same request, the image as a frame reference.
        stored_user = turn.request_messages[1]
        assert image_parts(stored_user["content"]) == [
            {"type": "image_url", "image_url": {"frame_step": turn.frame.step, "detail": "low"}}
        ]
        assert turn.request_messages[0] == system
        assert "base64" not in json.dumps(turn.request_messages)
        assert turn.tool_calls[0]["function"]["name"] == "interact_many"
        assert json.loads(turn.tool_calls[0]["function"]["arguments"]) == {"actions": turn.actions}
        assert (turn.prompt_tokens, turn.completion_tokens) == (120, 12)
        assert turn.finish_reason == "tool_calls"
        assert turn.error == turn.error_kind == ""
        assert received.headers["authorization"] == "Bearer sk-no-key"
    assert [t.frame.step for t in turns] == [0, 2, 3]
    summary = selectors.batch_summary(batch=batch)
    assert summary["model_calls"] == 3 and summary["total_tool_calls"] == 3
    assert summary["model_errors"] == summary["model_retries"] == 0
    assert (summary["prompt_tokens"], summary["completion_tokens"]) == (360, 36)


@pytest.mark.django_db
def test_it_shows_history_frames_oldest_first_with_the_last_actions(chat_server):
    chat_server.script(
        replies.tool_call("move_left"),
        replies.tool_call("move_up", "move_up"),
        replies.tool_call("do"),
        replies.tool_call("noop"),
    )
    batch = play(chat_server, steps=6, history_frames=2)
    episode = batch.episodes.get()
    last = chat_server.requests[3].body["messages"][1]["content"]
    # turn 3 saw frame 4; the two turns before it saw frames 1 and 3
    assert [sent_png(p) for p in image_parts(last)] == [
        stored_png(episode, 1),
        stored_png(episode, 3),
        stored_png(episode, 4),
    ]
    assert "oldest first" in last[0]["text"]
    assert "step 1: move_up, move_up" in last[0]["text"]
    assert "step 3: do" in last[0]["text"]
    assert last[0]["text"].index("step 1") < last[0]["text"].index("step 3")
    stored = episode.turns.get(index=3).request_messages[1]["content"]
    assert [p["image_url"]["frame_step"] for p in image_parts(stored)] == [1, 3, 4]
    first = chat_server.requests[0].body["messages"][1]["content"]
    assert len(image_parts(first)) == 1  # nothing before the first turn


def test_a_frame_is_encoded_once_but_never_sent_with_another_frames_data():
    from rollouts.policies.openai.messages import ImageUrls

    urls = ImageUrls(keep=2)
    first, replayed = b"\x89PNG first frame", b"\x89PNG another game, same step"
    url = urls.url(0, first)
    assert url == "data:image/png;base64," + base64.b64encode(first).decode()
    assert urls.url(0, first) is url  # reused, not encoded again
    # The same step with other bytes (an episode replayed after a crash) is encoded afresh.
    assert urls.url(0, replayed) == "data:image/png;base64," + base64.b64encode(replayed).decode()
    urls.url(1, b"one")
    urls.url(2, b"two")
    assert len(urls._urls) == 2  # bounded: only what history can still show


@pytest.mark.django_db
def test_it_compares_image_only_and_text_only_on_the_same_seed(chat_server):
    image_batch = play(chat_server, steps=2, observation_mode="image")
    text_batch = play(chat_server, steps=2, observation_mode="text", history_frames=1)
    image_turn = image_batch.episodes.get().turns.get(index=0)
    text_turn = text_batch.episodes.get().turns.get(index=0)
    image_request = chat_server.requests[0].body["messages"][1]["content"]
    text_request = chat_server.requests[2].body["messages"][1]["content"]
    texts = [p["text"] for p in image_request if p["type"] == "text"]
    assert image_turn.observation_text not in texts
    assert sent_png(image_parts(image_request)[0]) == stored_png(image_turn.episode, 0)
    assert image_parts(text_request) == []
    assert text_turn.observation_text in [p["text"] for p in text_request]
    second_text = chat_server.requests[3].body["messages"][1]["content"]
    assert image_parts(second_text) == [] and "step 0: noop" in second_text[0]["text"]
    assert "no image" in chat_server.requests[2].body["messages"][0]["content"]


@pytest.mark.django_db
def test_it_sends_the_endpoints_own_key_and_never_stores_it(chat_server, chat_endpoint, settings):
    settings.OPENAI_API_KEY = "sk-server-wide-secret-999"
    batch = record_batch(
        policy="openai",
        model="test-vlm",
        endpoint=chat_endpoint.name,
        base_url=chat_endpoint.base_url,
        seeds=(3,),
        steps=1,
    )
    headers = chat_server.requests[0].headers
    assert headers["authorization"] == "Bearer sk-test-endpoint-key-0123456789"
    rows = [*RolloutBatch.objects.values(), *Episode.objects.values(), *Turn.objects.values()]
    assert "sk-test-endpoint" not in json.dumps(rows, default=str)
    assert batch.endpoint_name == "local-test" and batch.endpoint == chat_server.url
    assert batch.episodes.get().status == Episode.Status.FINISHED


# --- text answers, reasoning ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "actions"),
    [
        ('{"actions": ["move_left", "do"]}', ["move_left", "do"]),
        ('```json\n{"actions": ["Move_Up"]}\n```', ["move_up"]),
        ("I will go `move_right` and then `do` it.", ["move_right", "do"]),
        ("Let me move left, then place table.", ["move_left", "place_table"]),
        ("I should sleep now.", ["sleep"]),
        ("I do not know what to do here.", ["do", "do"]),
        ("Nothing comes to mind.", []),
        (" ".join(["noop"] * 12), ["noop"] * 8),
    ],
)
def test_it_reads_action_names_out_of_text(answer, actions):
    assert actions_from_text(answer) == actions


@pytest.mark.django_db
def test_it_plays_actions_written_in_text_and_records_the_fallback(chat_server):
    chat_server.script(
        replies.text("Trees ahead. I'll `move_left` then `do`."),
        replies.text("Hmm, no idea."),
    )
    batch = play(chat_server, steps=4)
    episode = batch.episodes.get()
    first, second, third = episode.turns.order_by("index")
    assert first.actions == ["move_left", "do"] and first.text_fallback
    assert first.model_text == "Trees ahead. I'll `move_left` then `do`."
    assert first.tool_calls == [] and first.error_kind == ""
    assert second.error_kind == "no_tool_call" and second.actions == ["noop"]
    assert not second.text_fallback and not third.text_fallback
    assert episode.bad_outputs == 1 and episode.model_errors == 0


@pytest.mark.django_db
def test_it_records_reasoning_from_the_server_and_from_think_tags(chat_server):
    with_field = replies.tool_call("do")
    with_field.reasoning = "A tree is to my right."
    with_field.content = "Chopping."
    chat_server.script(with_field, replies.text("<think>Water is left.</think>`move_left`"))
    batch = play(chat_server, steps=2)
    first, second = batch.episodes.get().turns.order_by("index")
    assert first.reasoning_text == "A tree is to my right." and first.model_text == "Chopping."
    assert second.reasoning_text == "Water is left." and second.model_text == "`move_left`"
    assert second.actions == ["move_left"] and second.text_fallback


# --- faults ---------------------------------------------------------------------------------


FAULTS = [
    # (scripted replies for turn 1, extra settings, error_kind, retries, counter)
    ([replies.status(500), replies.status(503)], {"max_retries": 1}, "http_503", 1, "errors"),
    ([replies.slow(2.0)], {"request_timeout": 0.5, "max_retries": 0}, "timeout", 0, "errors"),
    ([replies.closed(), replies.closed()], {"max_retries": 1}, "connection", 1, "errors"),
    ([replies.status(400, message="bad image")], {}, "http_400", 0, "errors"),
    ([replies.raw_arguments('{"actions": ["do"')], {}, "malformed_arguments", 0, "bad"),
    ([replies.raw_arguments('{"moves": ["do"]}')], {}, "malformed_arguments", 0, "bad"),
    ([replies.tool_call("move_right", "jump")], {}, "unknown_action", 0, "bad"),
    ([replies.tool_call("do", name="attack")], {}, "wrong_tool", 0, "bad"),
    ([replies.empty()], {}, "empty_answer", 0, "bad"),
    ([replies.Reply(no_choices=True)], {}, "empty_answer", 0, "bad"),
    ([replies.refusal("I can't help with that.")], {}, "refusal", 0, "bad"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("script", "extra", "kind", "retries", "counter"), FAULTS)
def test_it_records_each_fault_and_plays_noop(chat_server, script, extra, kind, retries, counter):
    chat_server.script(replies.tool_call("move_right"), *script)
    batch = play(chat_server, steps=3, **extra)
    episode = batch.episodes.get()
    assert episode.status == Episode.Status.FINISHED
    turns = list(episode.turns.order_by("index"))
    assert len(turns) == 3
    failed = turns[1]
    assert failed.error_kind == kind and failed.error
    assert failed.actions == ["noop"]
    assert failed.retries == retries
    assert [t.error_kind for t in (turns[0], turns[2])] == ["", ""]
    assert (episode.model_errors, episode.bad_outputs) == (
        (1, 0) if counter == "errors" else (0, 1)
    )
    assert episode.model_calls == 3 and episode.model_retries == retries
    summary = selectors.batch_summary(batch=batch)
    assert summary["model_errors"] == 1 and summary["model_retries"] == retries
    assert summary["bad_outputs"] == (1 if counter == "bad" else 0)
    assert summary["status"] == "finished"


@pytest.mark.django_db
def test_it_keeps_the_raw_malformed_arguments_on_the_turn(chat_server):
    chat_server.script(replies.raw_arguments('{"actions": [move_left]}'))
    batch = play(chat_server, steps=1)
    turn = batch.episodes.get().turns.get()
    assert turn.tool_calls[0]["function"]["arguments"] == '{"actions": [move_left]}'
    assert "not JSON" in turn.error


@pytest.mark.django_db
def test_it_ends_the_episode_on_bad_output_when_told_to(chat_server):
    chat_server.script(replies.tool_call("move_right"), replies.tool_call("fly"))
    batch = play(chat_server, steps=10, on_bad_output="end")
    episode = batch.episodes.get()
    assert episode.status == Episode.Status.FINISHED
    assert episode.turns.count() == 2 and episode.steps == 1
    last = episode.turns.get(index=1)
    assert last.error_kind == "unknown_action" and last.actions == []
    assert len(chat_server.requests) == 2


@pytest.mark.django_db
def test_it_ends_the_episode_after_failed_retries_when_told_to(chat_server):
    chat_server.script(replies.tool_call("do"), replies.status(502), replies.status(502))
    batch = play(chat_server, steps=10, on_bad_output="end", max_retries=1)
    episode = batch.episodes.get()
    assert episode.turns.count() == 2
    assert episode.turns.get(index=1).error_kind == "http_502"
    assert (episode.model_errors, episode.model_retries) == (1, 1)


@pytest.mark.django_db
def test_it_honours_retry_after_and_counts_the_retry(chat_server):
    chat_server.script(replies.status(429, retry_after="1"), replies.tool_call("do"))
    batch = play(chat_server, steps=1)
    turn = batch.episodes.get().turns.get()
    assert turn.actions == ["do"] and turn.error == "" and turn.retries == 1
    first, second = chat_server.requests
    # The scripted backoff is 10 ms; only Retry-After explains a second's wait.
    assert second.at - first.at >= 1.0
    summary = selectors.batch_summary(batch=batch)
    assert summary["model_retries"] == 1 and summary["model_errors"] == 0


@pytest.mark.django_db
def test_it_recovers_from_a_server_error_and_a_dropped_connection(chat_server):
    chat_server.script(
        replies.tool_call("noop"), replies.status(500), replies.closed(), replies.tool_call("do")
    )
    batch = play(chat_server, steps=2, max_retries=3)
    turn = batch.episodes.get().turns.get(index=1)
    assert turn.actions == ["do"] and turn.error_kind == "" and turn.retries == 2


@pytest.mark.django_db
def test_it_drops_a_parameter_the_server_rejects_by_name(chat_server):
    chat_server.script(
        replies.status(
            400,
            message="Unsupported parameter: 'max_tokens' is not supported with this model. "
            "Use 'max_completion_tokens' instead.",
        )
    )
    batch = play(chat_server, steps=2, max_tokens=300)
    assert batch.episodes.get().turns.filter(error_kind="").count() == 2
    retried, after = chat_server.requests[1].body, chat_server.requests[2].body
    assert "max_tokens" not in retried and retried["max_completion_tokens"] == 300
    assert "max_tokens" not in after


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after": "3"}, 3.0),
        ({"retry-after": "0.5", "retry-after-ms": "250"}, 0.25),
        ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0),  # in the past: at once
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
def test_it_reads_the_wait_a_server_asks_for(headers, seconds):
    assert retry_after_seconds(headers) == seconds


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_it_fails_the_batch_at_once_when_the_endpoint_is_down(transactional_db, settings):
    settings.OPENAI_API_KEY = ""
    out = io.StringIO()
    with pytest.raises(CommandError, match="6 of 6 episodes failed") as failed:
        call_command(
            "rollout",
            "--policy=openai",
            "--model=test-vlm",
            f"--base-url=http://127.0.0.1:{_closed_port()}/v1",
            "--seeds=0-5",
            "--steps=50",
            "--concurrency=2",
            "--inline",
            stdout=out,
        )
    assert failed.value.returncode == 1
    summary = json.loads(out.getvalue().strip().splitlines()[-1])
    assert summary["failed"] == 6 and summary["finished"] == 0
    assert summary["status"] == "failed"
    batch = RolloutBatch.objects.get(id=summary["batch_id"])
    assert "unreachable" in batch.error and "\n" not in batch.error
    assert Turn.objects.filter(episode__batch=batch).count() == 0
    assert set(batch.episodes.values_list("status", flat=True)) == {"failed"}


@pytest.mark.django_db
def test_it_fails_the_batch_when_the_endpoint_rejects_the_model(chat_server):
    chat_server.default = replies.status(404, message="model 'test-vlm' not found")
    batch = play(chat_server, seeds=(1, 2))
    assert batch.status == RolloutBatch.Status.FAILED
    assert "refused model 'test-vlm'" in batch.error and "not found" in batch.error
    assert len(chat_server.requests) == 1  # the second episode never called
    assert batch.episodes.filter(status=Episode.Status.FAILED).count() == 2


@pytest.mark.django_db
def test_it_gives_up_on_an_endpoint_that_stops_answering(chat_server, settings):
    settings.STUDIO_OPENAI_MAX_FAILED_TURNS = 3
    chat_server.script(replies.tool_call("noop"))
    chat_server.default = replies.status(500)
    batch = play(chat_server, steps=50, max_retries=1)
    assert batch.status == RolloutBatch.Status.FAILED
    assert "failed 3 turns in a row" in batch.error
    episode = batch.episodes.get()
    assert episode.status == Episode.Status.FAILED
    # Counted: every turn that called, the one that gave up too (one retry each): each
    # request the server received is a call or a retry.
    assert (episode.model_calls, episode.model_errors, episode.model_retries) == (4, 3, 3)
    assert batch.model_calls + batch.model_retries == len(chat_server.requests)
    # ... and kept, so a reviewer sees how the episode failed.
    assert list(episode.turns.values_list("error_kind", flat=True)) == ["", "http_500", "http_500"]
    assert len(chat_server.requests) == 1 + 3 * 2


# --- many episodes at once -------------------------------------------------------------------


def test_it_runs_a_batch_on_a_celery_worker_within_the_shared_limit(celery_worker, chat_server):
    chat_server.delay = 0.05
    settings = RolloutSettings(
        policy="openai",
        model="test-vlm",
        base_url=chat_server.url,
        seeds=(0, 1, 2, 3, 4, 5),
        steps=4,
        concurrency=2,
    )
    batch = wait_for_row(services.batch_create(settings=settings), statuses=BATCH_ENDS, timeout=120)
    assert batch.status == RolloutBatch.Status.FINISHED, batch.error
    assert batch.episodes_finished == 6
    assert len(chat_server.requests) == 24
    # 6 episodes on 4 worker threads against 2 slots: both are used at once, never 3.
    assert chat_server.max_in_flight == 2
    summary = selectors.batch_summary(batch=batch)
    assert summary["model_calls"] == 24 and summary["total_tool_calls"] == 24
    assert summary["prompt_tokens"] == 24 * 120
