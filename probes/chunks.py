"""Asking a probe run's chunk: the worker's side of a run (`probes.runs`).

Each chunk is one Celery task that claims its row (`probes.jobs.PROBE_CHUNK`), asks its
questions one after another through the rollouts' model client (`probes.asking`), and stores
each answer as it comes, in one transaction with the run's counters and a check of its
claim. A chunk taken over after its worker died (its claim went stale; the periodic requeue
sends it again) skips every question already answered: a stored answer is never asked again.
The last chunk to end closes the run. An unusable endpoint (unreachable, refusing the model
or the key, or failing question after question) fails the run at once (`probe_run_fail`).
"""

from __future__ import annotations

import functools
import logging

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from probes.asking import Asked, ProbeAsker, asked_from
from probes.jobs import PROBE_CHUNK
from probes.models import ProbeAnswer, ProbeQuestion, ProbeRun, ProbeRunChunk
from probes.prompting import question_messages
from probes.results import is_error
from rollouts.policies.base import PolicyUnavailable
from rollouts.policies.openai import ChatOptions
from rollouts.recording import sent_calls
from rollouts.recording.frame_store import FrameStore
from studio.claim_keeper import worker_name
from studio.claims import Claim
from studio.endpoints import (
    endpoint_enabled_first,
)
from studio.errors import plain_error
from studio.jobs import ClaimLost, JobOutcome
from studio.models import Endpoint
from studio.transactions import commit_without_flush_wait, fetch_and_commit
from studio.untrusted import storable

logger = logging.getLogger(__name__)

ERROR_BYTES = 4000
MAX_CONCURRENCY = 256  # as a batch's (`RolloutSettings.concurrency`)
OPEN = (ProbeRun.Status.PENDING, ProbeRun.Status.RUNNING)


def probe_run_fail(*, run_id: int, error: str) -> int:
    """Stop a run that cannot go on: its open chunks fail (a worker asking one loses its
    claim, and stops before its next call or answer), and the run says why. Returns how many
    chunks were stopped."""
    now = timezone.now()
    error = storable(error, max_bytes=ERROR_BYTES)
    with transaction.atomic():
        stopped = ProbeRunChunk.objects.filter(
            run_id=run_id,
            status__in=[ProbeRunChunk.Status.PENDING, ProbeRunChunk.Status.RUNNING],
        ).update(status=ProbeRunChunk.Status.FAILED, error=error, claim_token="", finished_at=now)
        ProbeRun.objects.filter(id=run_id, status__in=OPEN).update(
            status=ProbeRun.Status.FAILED, error=error, finished_at=now
        )
    return stopped


# --- asking a chunk ----------------------------------------------------------------------


def probe_chunk_run(*, chunk_id: int) -> JobOutcome:
    """Claim the chunk and ask its questions not answered yet, storing each answer as it
    comes. Idempotent: a second delivery finds the chunk claimed or ended."""
    token = PROBE_CHUNK.claim(chunk_id, worker=worker_name())
    if token is None:
        return PROBE_CHUNK.unclaimed(chunk_id)
    chunk = ProbeRunChunk.objects.select_related("run", "run__probe_set").get(id=chunk_id)
    run = chunk.run
    ProbeRun.objects.filter(id=run.id, status=ProbeRun.Status.PENDING).update(
        status=ProbeRun.Status.RUNNING, started_at=timezone.now()
    )
    claim = PROBE_CHUNK.held(chunk_id, token)
    with claim.kept():
        outcome = _chunk_ask(chunk, claim)
    if outcome == "done" and claim.finish():
        _run_close_if_complete(run_id=run.id)
    return outcome


def _chunk_ask(chunk: ProbeRunChunk, claim: Claim) -> JobOutcome:
    """Ask the chunk's questions not answered yet, storing each answer as it comes, while
    this worker holds its claim: "done", or why it stopped."""
    run, chunk_id, token = chunk.run, chunk.id, claim.token
    held = claim.checked(CLAIM_CHECK_SECONDS)
    key = ""  # the question being asked's count of requests sent (`sent_calls`)
    try:
        asker = ProbeAsker(asker_options(run), seed=run.probe_set.seed)
        asker.before_retry = held.check  # a canceled run sends no retry either
        store = FrameStore()
        questions = list(_questions_left(chunk))
        _unanswered_calls_settle(run=run, question_ids=[q.id for q in questions])
        for question in questions:
            held.check()  # a canceled run (or a chunk taken over) asks nothing more
            key = sent_calls.question_key(run.id, question.id, run_created_at=run.created_at)
            asker.on_send = lambda retry, key=key: sent_calls.count_sent(key, retry=retry)
            asked = _ask(asker, run=run, question=question, store=store)
            _answer_store(run=run, chunk_id=chunk_id, token=token, question=question, asked=asked)
    except ClaimLost:
        logger.info("probe chunk %s: no longer held (canceled or taken over); stopped", chunk_id)
        return "claim_lost"
    except PolicyUnavailable as exc:
        if exc.decision is not None:  # the question that gave up: its calls were made
            _calls_count(run_id=run.id, asked=asked_from(exc.decision, "", ""), key=key)
        probe_run_fail(run_id=run.id, error=str(exc))
        return "failed"
    except Exception as exc:  # a poison chunk is set aside, and its run with it: never stuck
        # An outage (the database or the broker gone) hands the claim back and is raised
        # again here, for the task to retry: the chunk goes on from its last stored answer.
        claim.fail(plain_error(exc))
        logger.exception("probe chunk %s failed", chunk_id)
        probe_run_fail(run_id=run.id, error=f"chunk {chunk.index}: {plain_error(exc)}")
        return "failed"
    return "done"


# How often a chunk reads whether it is still its worker's (canceled, failed with its run,
# taken over): at most once a second, so short calls do not pay a query each.
CLAIM_CHECK_SECONDS = 1.0


def asker_options(run: ProbeRun) -> ChatOptions:
    """The client's options: the run's endpoint, URL, model and concurrency, the endpoint's
    requests per minute, and the rollouts' defaults for the rest (retries, timeout)."""
    endpoint = endpoint_enabled_first(kind=Endpoint.Kind.CHAT, name=run.endpoint_name)
    return ChatOptions(
        model=run.model,
        endpoint=run.endpoint_name,
        base_url=run.base_url,
        concurrency=min(max(1, run.concurrency), MAX_CONCURRENCY),
        requests_per_minute=endpoint.requests_per_minute if endpoint is not None else 0,
    )


def _questions_left(chunk: ProbeRunChunk):
    answered = ProbeAnswer.objects.filter(run_id=chunk.run_id).values("question_id")
    fields = ["id", "index", "kind", "text", "choices", "answer"]
    related = {"image": ("frame", "frame__image"), "text": ("turn", "turn__observation_text")}
    joined = related.get(chunk.run.observation)
    if joined is not None:
        fields.append(joined[1])
    questions = ProbeQuestion.objects.filter(
        probe_set_id=chunk.run.probe_set_id, index__gte=chunk.first, index__lt=chunk.last
    ).exclude(id__in=answered)
    if joined is not None:
        questions = questions.select_related(joined[0])
    return questions.only(*fields).order_by("index")


def _ask(asker: ProbeAsker, *, run: ProbeRun, question: ProbeQuestion, store: FrameStore) -> Asked:
    png, observation_text = None, ""
    if run.observation == ProbeRun.Observation.IMAGE:
        try:
            png = store.read(question.frame.image.name)
        except (OSError, ValueError) as exc:
            return Asked(error_kind="frame_unreadable", error=storable(str(exc), max_bytes=500))
    elif run.observation == ProbeRun.Observation.TEXT:
        turn = question.turn
        if turn is None or not turn.observation_text:
            return Asked(error_kind="no_observation_text", error="the frame's turn is gone")
        observation_text = turn.observation_text
    messages = question_messages(
        observation=run.observation,
        text=question.text,
        choices=question.choices,
        png=png,
        observation_text=observation_text,
    )
    return asker.ask(messages, list(question.choices))


def _answer_store(
    *, run: ProbeRun, chunk_id: int, token: str, question: ProbeQuestion, asked: Asked
) -> None:
    """The answer and the run's counters in one transaction, only while this worker holds
    the chunk (else `ClaimLost`, and nothing is written). The claim's heartbeat is the
    keeper's (`studio.claim_keeper`)."""
    error = is_error(asked.error_kind)
    correct = not error and bool(asked.choice) and asked.choice == question.answer
    answer = ProbeAnswer(
        run_id=run.id,
        question_id=question.id,
        choice=asked.choice,
        correct=correct,
        model_text=asked.model_text,
        error=asked.error,
        error_kind=asked.error_kind[:40],
        latency_ms=min(asked.latency_ms, 2**31 - 1),
        prompt_tokens=asked.prompt_tokens,
        completion_tokens=asked.completion_tokens,
        retries=min(asked.retries, 32767),
        created_at=timezone.now(),
    )
    counts = {
        "answered": 1,
        "correct": int(correct),
        "errors": int(error),
        "model_calls": asked.requests,
        "model_retries": asked.retries,
        "prompt_tokens": asked.prompt_tokens,
        "completion_tokens": asked.completion_tokens,
    }
    with transaction.atomic():
        # A commit lost in a database crash loses that answer only: its question has no
        # answer, so the chunk's next claim asks it again.
        commit_without_flush_wait()
        insert = _answer_insert if connection.vendor == "postgresql" else _answer_insert_orm
        stored = insert(answer=answer, counts=counts, chunk_id=chunk_id, token=token)
    if not stored:
        # Canceled, or taken over: the answer is not this worker's to store, but its calls
        # were made and are counted.
        _calls_count(
            run_id=run.id,
            asked=asked,
            key=sent_calls.question_key(run.id, question.id, run_created_at=run.created_at),
        )
        raise ClaimLost(f"probe chunk {chunk_id} is no longer this worker's")


def _answer_insert_orm(
    *, answer: ProbeAnswer, counts: dict[str, int], chunk_id: int, token: str
) -> bool:
    # The row lock taken here holds off a takeover's claim until this answer is committed.
    held = (
        ProbeRunChunk.objects.select_for_update()
        .filter(id=chunk_id, claim_token=token, status=ProbeRunChunk.Status.RUNNING)
        .exists()
    )
    if not held:
        return False
    answer.save(force_insert=True)
    ProbeRun.objects.filter(id=answer.run_id).update(
        **{name: F(name) + value for name, value in counts.items()}
    )
    return True


def _answer_insert(
    *, answer: ProbeAnswer, counts: dict[str, int], chunk_id: int, token: str
) -> bool:
    """`_answer_insert_orm` as one statement and its commit (PostgreSQL): every answer of a
    run takes this path, 64 at once on a worker's cores, where the ORM spent more CPU
    building the three statements than the database took running them."""
    sql, fields = _answer_sql()
    params = [chunk_id, token, ProbeRunChunk.Status.RUNNING]
    params += [f.get_db_prep_save(f.pre_save(answer, True), connection) for f in fields]
    params += [*(counts[name] for name in _COUNTERS), answer.run_id]
    return fetch_and_commit(sql, params) is not None


@functools.cache
def _answer_sql() -> tuple[str, list]:
    quote = connection.ops.quote_name
    chunk, answer, run = (m._meta for m in (ProbeRunChunk, ProbeAnswer, ProbeRun))
    fields = [f for f in answer.concrete_fields if not f.primary_key]
    names = ", ".join(quote(f.column) for f in fields)
    values = ", ".join(["%s"] * len(fields))
    sets = ", ".join(f"{quote(name)} = {quote(name)} + %s" for name in _COUNTERS)
    sql = (
        # FOR SHARE: a takeover's claim (an UPDATE of the chunk) waits for this commit.
        f"WITH held AS (SELECT 1 FROM {quote(chunk.db_table)} WHERE id = %s"
        " AND claim_token = %s AND status = %s FOR SHARE),"
        f" stored AS (INSERT INTO {quote(answer.db_table)} ({names})"
        f" SELECT {values} FROM held RETURNING 1)"
        f" UPDATE {quote(run.db_table)} SET {sets}"
        " WHERE id = %s AND EXISTS (SELECT 1 FROM stored) RETURNING 1"
    )
    return sql, fields


_COUNTERS = (
    "answered",
    "correct",
    "errors",
    "model_calls",
    "model_retries",
    "prompt_tokens",
    "completion_tokens",
)


def _calls_count(*, run_id: int, asked: Asked, key: str) -> None:
    """Count calls no answer was stored for (the question after which the run gave up);
    counted here, they are no longer the question's to settle (`_unanswered_calls_settle`)."""
    ProbeRun.objects.filter(id=run_id).update(
        model_calls=F("model_calls") + asked.requests,
        model_retries=F("model_retries") + asked.retries,
        prompt_tokens=F("prompt_tokens") + asked.prompt_tokens,
        completion_tokens=F("completion_tokens") + asked.completion_tokens,
    )
    sent_calls.forget([key])


def _unanswered_calls_settle(*, run: ProbeRun, question_ids: list[int]) -> None:
    """Count on the run the requests sent for questions no answer was stored for (a worker
    killed while asking them), before they are asked again: a stored answer counts its own."""
    keys = [
        sent_calls.question_key(run.id, question_id, run_created_at=run.created_at)
        for question_id in question_ids
    ]
    sent = sent_calls.questions_sent(keys)
    if not any(sent.values()):
        return
    ProbeRun.objects.filter(id=run.id).update(
        model_calls=F("model_calls") + sent[sent_calls.FIRST_TRIES] + sent[sent_calls.RETRIES],
        model_retries=F("model_retries") + sent[sent_calls.RETRIES],
    )
    sent_calls.forget(keys)


def _run_close_if_complete(*, run_id: int) -> bool:
    """Close the run as done once none of its chunks is open. Each chunk's end is committed
    before it looks, so the last of several ending together sees them all ended."""
    still_open = ProbeRunChunk.objects.filter(
        run_id=run_id,
        status__in=[ProbeRunChunk.Status.PENDING, ProbeRunChunk.Status.RUNNING],
    )
    closed = (
        ProbeRun.objects.filter(id=run_id, status__in=OPEN)
        .exclude(id__in=still_open.values("run_id"))
        .update(status=ProbeRun.Status.DONE, finished_at=timezone.now())
    )
    return closed == 1
