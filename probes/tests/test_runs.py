"""Probe runs against the real local chat server: what is sent, what a fixed answer scores,
and hostile or failing answers recorded on the run, which still completes."""

from __future__ import annotations

import base64
import json
import time
from collections import Counter, defaultdict
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction

from probes import chunks, runs, selectors_runs
from probes.models import ProbeAnswer, ProbeQuestion, ProbeRun
from probes.services import probe_set_create
from rollouts.models import Frame
from rollouts.review.turn_selection import TurnSelection
from rollouts.tests import openai_server as replies
from rollouts.tests.helpers import EndpointDisabler, record_batch
from studio.models import Endpoint

pytestmark = pytest.mark.django_db

KEY = "sk-test-endpoint-key-0123456789"  # conftest's chat_endpoint fixture sets it
LETTERS = "ABCDEFGHIJ"


@pytest.fixture
def probe_set(db):
    batch = record_batch(seeds=(4,), steps=10)
    return probe_set_create(filters=TurnSelection(batches=(batch.id,)), seed=11)


@pytest.fixture
def small_set(db):
    # Two kinds, two questions a frame: runs whose replies are scripted one by one.
    batch = record_batch(seeds=(2,), steps=6)
    return probe_set_create(
        filters=TurnSelection(batches=(batch.id,)), kinds=["night", "asleep"], seed=3
    )


def run_inline(probe_set, endpoint, **options) -> ProbeRun:
    run = runs.probe_run_create(
        probe_set=probe_set,
        endpoint_name=endpoint.name,
        model=options.pop("model", "vlm-test"),
        enqueue=False,
        **options,
    )
    return runs.probe_run_inline(run=run)


def summary_of(run: ProbeRun) -> dict:
    return selectors_runs.probe_run_summary(run=run)


def test_it_scores_a_fixed_answer_as_the_answer_distribution_predicts(
    probe_set, chat_server, chat_endpoint
):
    chat_server.default = replies.text("A")
    Endpoint.objects.filter(id=chat_endpoint.id).update(
        input_price_per_million=Decimal("2.50"), output_price_per_million=Decimal("10.00")
    )
    run = run_inline(probe_set, chat_endpoint)

    # Expected from the stored questions alone: "A" is right where the first choice is.
    questions = list(ProbeQuestion.objects.filter(probe_set=probe_set))
    right, asked = Counter(), Counter()
    for q in questions:
        asked[q.kind] += 1
        right[q.kind] += q.choices[0] == q.answer
    assert len(questions) > 100 and len(asked) == 8

    assert run.status == "done"
    assert run.answered == run.questions_total == len(questions)
    assert run.correct == sum(right.values())
    assert run.errors == 0
    assert run.model_calls == len(questions) == len(chat_server.requests)
    assert run.prompt_tokens == 120 * len(questions)  # the server's usage per answer
    assert run.completion_tokens == 12 * len(questions)
    summary = summary_of(run)
    assert summary["questions"] == summary["answered"] == len(questions)
    # 120 prompt tokens at $2.50 and 12 completion tokens at $10 a million, per question.
    assert summary["spend"] == round(len(questions) * 0.00042, 6)
    assert summary["accuracy"] == round(sum(right.values()) / len(questions), 4)
    for kind, n in asked.items():
        assert summary["kinds"][kind]["accuracy"] == round(right[kind] / n, 4), kind
        low, high = summary["kinds"][kind]["interval"]
        assert low <= right[kind] / n <= high
    # Chance: yes/no questions have two choices, counts four (0, 1, 2, 3+).
    assert summary["kinds"]["night"]["chance"] == 0.5
    assert summary["kinds"]["count"]["chance"] == 0.25
    # Every answer names the first choice.
    first = {q.id: q.choices[0] for q in questions}
    assert all(a.choice == first[a.question_id] for a in ProbeAnswer.objects.filter(run=run))


def test_it_sends_the_stored_png_the_question_and_lettered_choices(
    small_set, chat_server, chat_endpoint
):
    chat_server.default = replies.text("B")
    run_inline(small_set, chat_endpoint, model="vlm-x")
    first = ProbeQuestion.objects.filter(probe_set=small_set).order_by("index").first()
    body = chat_server.requests[0].body
    assert chat_server.requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert body["model"] == "vlm-x"
    assert "tools" not in body and "tool_choice" not in body
    # One letter is asked for: a few tokens, not a turn's 512.
    assert body["max_tokens"] == 32
    system, user = body["messages"]
    assert system["role"] == "system" and "letter" in system["content"]
    image = [p for p in user["content"] if p["type"] == "image_url"]
    assert len(image) == 1
    url = image[0]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    frame = Frame.objects.get(id=first.frame_id)
    with frame.image.open("rb") as stored:
        assert base64.b64decode(url.split(",", 1)[1]) == stored.read()
    text = user["content"][-1]["text"]
    assert text.startswith(first.text)
    for i, choice in enumerate(first.choices):
        assert f"\n{LETTERS[i]}. {choice}" in text


def test_it_sends_the_text_observation_or_nothing_as_controls(
    small_set, chat_server, chat_endpoint
):
    chat_server.default = replies.text("A")
    first = ProbeQuestion.objects.filter(probe_set=small_set).order_by("index").first()
    run_inline(small_set, chat_endpoint, observation="text")
    parts = chat_server.requests[0].body["messages"][1]["content"]
    assert all(p["type"] == "text" for p in parts)
    assert first.turn.observation_text in parts[0]["text"]
    sent = len(chat_server.requests)

    run_inline(small_set, chat_endpoint, observation="none")
    parts = chat_server.requests[sent].body["messages"][1]["content"]
    assert [p["type"] for p in parts] == ["text"]
    assert parts[0]["text"].startswith(first.text)
    assert first.turn.observation_text not in parts[0]["text"]


def test_it_records_garbage_hostile_bytes_and_429s_and_completes(
    small_set, chat_server, chat_endpoint, settings
):
    settings.STUDIO_MAX_RESPONSE_BYTES = 100_000
    questions = list(ProbeQuestion.objects.filter(probe_set=small_set).order_by("index"))
    assert len(questions) >= 8
    chat_server.default = replies.text("A")
    # Each question's replies, in order (the run asks one at a time here).
    chat_server.script(
        replies.raw(b"this is not JSON at all"),  # q0: garbage
        replies.Reply(payload={"choices": [{"message": {"content": "A\u0000"}}]}),  # q1: NUL
        replies.Reply(payload={"choices": [{"message": {"content": "B\ud800"}}]}),  # q2
        replies.huge(1_000_000),  # q3: more than the cap
        *[replies.status(429, retry_after="0")] * 5,  # q4: 429 after all 4 retries
        replies.status(503),  # q5: a 503, then an answer on the retry
        replies.text("B"),
        replies.text("I think it is probably the first one"),  # q6: names no choice
        replies.text("**b**"),  # q7: a letter in markdown
    )
    run = run_inline(small_set, chat_endpoint)

    assert run.status == "done", run.error
    assert run.answered == run.questions_total == len(questions)
    answers = {a.question_id: a for a in ProbeAnswer.objects.filter(run=run)}
    kinds = [answers[q.id].error_kind for q in questions[:8]]
    assert kinds == [
        "invalid_response",
        "invalid_text",
        "invalid_text",
        "answer_too_large",
        "http_429",
        "",
        "unparsed",
        "",
    ]
    for q in questions[:5] + questions[6:7]:
        assert answers[q.id].choice == "" and not answers[q.id].correct
    assert "\x00" not in answers[questions[1].id].model_text
    assert answers[questions[4].id].retries == 4
    assert answers[questions[5].id].retries == 1
    assert answers[questions[5].id].choice == questions[5].choices[1]
    assert answers[questions[7].id].choice == questions[7].choices[1]
    assert answers[questions[6].id].model_text == "I think it is probably the first one"
    assert run.errors == 6
    # Every request counted: one a question, plus 4 retries of q4 and one of q5.
    assert run.model_calls == len(questions) + 5 == len(chat_server.requests)
    assert run.model_retries == 5
    summary = summary_of(run)
    # The six errors are apart: accuracy is over the answers that named a choice.
    assert summary["errors"] == 6 and summary["answered"] == len(questions) - 6
    right = sum(a.correct for a in answers.values())
    assert summary["accuracy"] == round(right / (len(questions) - 6), 4)


def test_it_fails_the_run_at_once_when_the_endpoint_refuses_the_key(
    small_set, chat_server, chat_endpoint
):
    chat_server.default = replies.status(401, message="bad key sk-test-endpoint-key-0123456789")
    run = run_inline(small_set, chat_endpoint)
    assert run.status == "failed"
    assert "refused model 'vlm-test'" in run.error
    assert KEY not in run.error  # the key a server echoes is redacted
    assert len(chat_server.requests) == 1 == run.model_calls  # counted, though not stored
    assert run.chunks.filter(status="failed").count() == run.chunks.count()


def test_it_stops_after_questions_failing_in_a_row_and_resumes_what_is_left(
    small_set, chat_server, chat_endpoint, settings
):
    settings.STUDIO_OPENAI_MAX_FAILED_TURNS = 3
    total = small_set.questions.count()
    chat_server.script(replies.text("A"), replies.text("A"))
    chat_server.default = replies.status(500)
    # One chunk: the count of failures in a row is a chunk's, as it is an episode's.
    run = run_inline(small_set, chat_endpoint, concurrency=1)
    assert run.chunks.count() == 1
    assert run.status == "failed" and "failed 3 questions in a row" in run.error
    # Two answered, then two failed answers stored; the third failure stopped the run.
    assert run.answered == 4 and run.errors == 2
    asked = len(chat_server.requests)
    assert run.model_calls == asked  # the calls of the question that gave up included

    chat_server.default = replies.text("A")
    assert runs.probe_run_resume(run=run, enqueue=False) == run.chunks.count()
    run = runs.probe_run_inline(run=run)
    assert run.status == "done" and run.answered == total
    # The resume asked only the questions without an answer.
    assert len(chat_server.requests) - asked == total - 4


def test_the_command_prints_the_summary_and_refuses_bad_input(
    small_set, chat_server, chat_endpoint, capsys
):
    chat_server.default = replies.text("yes")
    call_command(
        "probe_run",
        str(small_set.id),
        "--endpoint",
        chat_endpoint.name,
        "--model",
        "vlm-test",
        "--inline",
    )
    line = capsys.readouterr().out.strip().splitlines()[-1]
    summary = json.loads(line)
    expected = defaultdict(lambda: [0, 0])
    for q in ProbeQuestion.objects.filter(probe_set=small_set):
        expected[q.kind][0] += q.answer == "yes"
        expected[q.kind][1] += 1
    assert set(summary) >= {
        "run_id",
        "set_id",
        "model",
        "observation",
        "questions",
        "answered",
        "errors",
        "accuracy",
        "kinds",
    }
    assert summary["set_id"] == small_set.id and summary["observation"] == "image"
    for kind, (right, n) in expected.items():
        assert summary["kinds"][kind]["accuracy"] == round(right / n, 4)
        assert summary["kinds"][kind]["chance"] == 0.5

    Endpoint.objects.filter(id=chat_endpoint.id).update(allowed_models=["other-model"])
    for args, message in [
        (["--model", "vlm-test"], "'vlm-test' is not allowed"),
        (["--model", "other-model", "--concurrency", "0"], "concurrency: 0"),
    ]:
        with pytest.raises(CommandError, match=message):
            call_command("probe_run", str(small_set.id), "--endpoint", chat_endpoint.name, *args)
    with pytest.raises(SystemExit):  # argparse's own check: one line, exit status 2
        call_command("probe_run", str(small_set.id), "--observation", "sound")
    with pytest.raises(CommandError, match="no chat endpoint named 'nowhere'"):
        call_command("probe_run", str(small_set.id), "--endpoint", "nowhere", "--model", "m")
    with pytest.raises(CommandError, match="there is no probe set 999999"):
        call_command("probe_run", "999999", "--endpoint", chat_endpoint.name, "--model", "m")
    assert ProbeRun.objects.count() == 1


@pytest.mark.parametrize("path", ["_answer_insert", "_answer_insert_orm"])
def test_an_answer_is_stored_only_while_its_chunk_is_held(path, small_set, chat_endpoint):
    # PostgreSQL takes the one-statement path, SQLite (the demo) the ORM's: the same rows.
    from probes.jobs import PROBE_CHUNK

    def insert(**options) -> bool:
        with transaction.atomic():  # as `_answer_store` calls it
            return getattr(chunks, path)(**options)

    run = runs.probe_run_create(
        probe_set=small_set, endpoint_name=chat_endpoint.name, model="m", enqueue=False
    )
    chunk = run.chunks.order_by("index").first()
    token = PROBE_CHUNK.claim(chunk.id)
    questions = list(ProbeQuestion.objects.filter(probe_set=small_set).order_by("index")[:2])
    counts = {
        "answered": 1,
        "correct": 1,
        "errors": 0,
        "model_calls": 3,
        "model_retries": 2,
        "prompt_tokens": 100,
        "completion_tokens": 7,
    }

    def answer(question):
        return ProbeAnswer(
            run_id=run.id, question_id=question.id, choice=question.answer, correct=True
        )

    assert insert(answer=answer(questions[0]), counts=counts, chunk_id=chunk.id, token=token)
    assert not insert(answer=answer(questions[1]), counts=counts, chunk_id=chunk.id, token="x")
    stored = ProbeAnswer.objects.get(run=run)
    assert (stored.question_id, stored.choice, stored.correct) == (
        questions[0].id,
        questions[0].answer,
        True,
    )
    assert stored.created_at is not None and not stored.flagged
    run.refresh_from_db()
    assert (run.answered, run.correct, run.errors, run.model_calls, run.model_retries) == (
        1,
        1,
        0,
        3,
        2,
    )
    assert (run.prompt_tokens, run.completion_tokens) == (100, 7)


def test_a_frame_gone_from_storage_is_that_questions_error_not_a_request(
    small_set, chat_server, chat_endpoint
):
    chat_server.default = replies.text("A")
    first = ProbeQuestion.objects.filter(probe_set=small_set).order_by("index").first()
    frame = Frame.objects.get(id=first.frame_id)
    # Frames alike share one file: every question on that file loses its image.
    lost = ProbeQuestion.objects.filter(probe_set=small_set, frame__image=frame.image.name).count()
    frame.image.storage.delete(frame.image.name)
    run = run_inline(small_set, chat_endpoint)
    assert run.status == "done" and run.answered == run.questions_total
    gone = ProbeAnswer.objects.filter(run=run, error_kind="frame_unreadable")
    assert gone.count() == lost >= 1
    assert run.errors == lost
    assert len(chat_server.requests) == run.model_calls == run.questions_total - lost


def test_it_keeps_to_the_endpoints_requests_per_minute(small_set, chat_server, chat_endpoint):
    chat_server.default = replies.text("A")
    Endpoint.objects.filter(id=chat_endpoint.id).update(requests_per_minute=1200)
    began = time.monotonic()
    run = run_inline(small_set, chat_endpoint)
    assert run.status == "done"
    arrived = [r.at for r in chat_server.requests]
    # 1,200 a minute: the limiter reserves an instant every 50 ms from the first request on,
    # and none leaves before its instant, so the n-th cannot arrive sooner than (n - 1) x
    # 50 ms after the run began. (Without the limit the local server answers them all in a
    # few ms each.)
    assert len(arrived) == run.questions_total >= 8
    assert all(at - began >= i * 0.05 for i, at in enumerate(arrived))


@pytest.mark.django_db(transaction=True)
def test_it_sends_the_key_at_most_once_after_the_endpoint_is_disabled(
    small_set, chat_server, chat_endpoint
):
    chat_server.delay = 0.2  # a model taking its time: the disable lands mid-question
    chat_server.default = replies.text("A")
    assert ProbeQuestion.objects.filter(probe_set=small_set).count() >= 8
    run = runs.probe_run_create(
        probe_set=small_set,
        endpoint_name=chat_endpoint.name,
        model="vlm-test",
        concurrency=1,
        enqueue=False,
    )
    admin = EndpointDisabler(server=chat_server, endpoint=chat_endpoint, after_requests=3)

    run = runs.probe_run_inline(run=run)

    assert len(admin.requests_after(KEY)) <= 1
    assert 3 <= len(chat_server.requests) <= 4
    chunk = run.chunks.get()
    assert run.status == chunk.status == "failed"
    assert run.error == chunk.error == "endpoint 'local-test' was disabled by an admin"
    assert 3 <= run.answered <= 4  # what was asked before it is kept
