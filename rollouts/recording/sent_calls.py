"""Model requests counted as they leave, in Redis: what a worker killed mid-call had sent.

A turn's (or a probe answer's) calls are counted in PostgreSQL with its row, once it is
written; a worker killed before that sent requests that no row holds. Each request is counted
here first (one HINCRBY, before the request goes out: a SIGKILL after it cannot undo it),
and whoever takes the work over settles what no row counted.

An episode's key holds its sent first tries and retries since it was created, as its row's
`model_calls` and `model_retries` hold those its written turns counted: the difference is
what was sent and never written. A probe question's key holds the requests sent for it; a
stored answer counts them itself, so only an unanswered question's count is settled.

Without Redis (the demo's filesystem broker) nothing is counted here: the rows' counts stand.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.conf import settings as django_settings

from rollouts.policies.rate_limit import redis_client

logger = logging.getLogger(__name__)

# Longer than any episode or probe run takes to be taken over and ended.
KEY_SECONDS = 7 * 24 * 3600
FIRST_TRIES = "model_calls"
RETRIES = "model_retries"


def _client():
    url = django_settings.REDIS_URL
    if not url or not url.startswith(("redis://", "rediss://", "unix://")):
        return None
    return redis_client(url)  # the limiter's client: one pool per URL and process


def episode_key(episode_id: int, *, batch_created_at: datetime) -> str:
    # With its batch's creation time: ids start again in a new database (a test's), and an
    # old count under the same id would be settled as this episode's.
    return f"studio:sent:episode:{episode_id}:{_stamp(batch_created_at)}"


def question_key(run_id: int, question_id: int, *, run_created_at: datetime) -> str:
    return f"studio:sent:probe:{run_id}:{_stamp(run_created_at)}:{question_id}"


def _stamp(moment: datetime) -> int:
    return round(moment.timestamp() * 1_000_000)


def count_sent(key: str, *, retry: bool) -> None:
    """Count one request about to be sent. Redis gone: the request still goes (the limiter
    waits out Redis before it; this count is then only as good as the rows')."""
    client = _client()
    if client is None:
        return
    try:
        # One round trip a request: the key's lifetime is set by the first count of a field.
        if client.hincrby(key, RETRIES if retry else FIRST_TRIES, 1) == 1:
            client.expire(key, KEY_SECONDS)
    except Exception as exc:  # a count is never worth a call's failure
        logger.warning("could not count a sent request in Redis: %s", type(exc).__name__)


def sent_counts(key: str) -> dict[str, int]:
    """First tries and retries counted under `key` (zeros without Redis or a key)."""
    client = _client()
    if client is None:
        return {FIRST_TRIES: 0, RETRIES: 0}
    values = client.hmget(key, [FIRST_TRIES, RETRIES])
    return {
        FIRST_TRIES: int(values[0] or 0),
        RETRIES: int(values[1] or 0),
    }


def unsettled_calls(key: str, *, counted: dict[str, int | None]) -> dict[str, int]:
    """What was sent under `key` beyond what the rows counted (`counted`), by field."""
    sent = sent_counts(key)
    return {name: max(0, sent[name] - int(counted.get(name) or 0)) for name in sent}


def questions_sent(keys: list[str]) -> dict[str, int]:
    """Requests counted for these probe questions (first tries and retries together)."""
    client = _client()
    if client is None or not keys:
        return {FIRST_TRIES: 0, RETRIES: 0}
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hmget(key, [FIRST_TRIES, RETRIES])
    totals = {FIRST_TRIES: 0, RETRIES: 0}
    for first, retries in pipe.execute():
        totals[FIRST_TRIES] += int(first or 0)
        totals[RETRIES] += int(retries or 0)
    return totals


def forget(keys: list[str]) -> None:
    client = _client()
    if client is not None and keys:
        client.delete(*keys)
