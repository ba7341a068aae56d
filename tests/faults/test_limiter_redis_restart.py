"""The model limiter's and the cache's Redis connections outlive a Redis restart: each worker
thread keeps a limiter connection between calls, and after a restart every one of them was
dead, so the next slot taken on it failed its episode. A request waits out a Redis that is
away, instead of handing its episode back."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollouts.policies import rate_limit
from tests.faults.stack import RedisServer


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


def test_every_threads_limiter_connection_survives_a_redis_restart(own_redis: RedisServer):
    limiter = rate_limit.limiter_for(
        base_url="http://127.0.0.1:9/v1",
        concurrency=4,
        requests_per_minute=6000,
        lease_seconds=30,
        redis_url=own_redis.url,
    )
    assert isinstance(limiter, rate_limit.RedisLimiter)
    restarted = threading.Event()
    failures: list[BaseException] = []
    calls = [0] * 4

    def episode(n: int) -> None:
        # A model call before the restart and after it, on the thread's own connection.
        try:
            for _ in range(2):
                limiter.wait_turn()
                with limiter.slot():
                    calls[n] += 1
                restarted.wait(30)
        except BaseException as exc:  # what failed an episode
            failures.append(exc)

    threads = [threading.Thread(target=episode, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)  # each thread has taken and released a slot: its connection is idle
    own_redis.restart()
    restarted.set()
    for thread in threads:
        thread.join(30)
    assert failures == []
    assert calls == [2, 2, 2, 2]
    assert limiter.in_flight() == 0


def test_the_caches_connections_survive_a_redis_restart(own_redis: RedisServer, settings):
    # (Its connections come from a pool, which checks each one it lends: the limiter's
    # threads keep theirs, and needed the health check and the retry.)
    from django.core.cache.backends.redis import RedisCache

    options = settings.CACHES["default"].get("OPTIONS", {})
    if "health_check_interval" not in options:
        pytest.skip("the cache is not Redis here (no REDIS_URL)")
    cache = RedisCache(own_redis.url, {"OPTIONS": options, "KEY_PREFIX": "faults"})
    cache.set("statistics", 1)
    assert cache.get("statistics") == 1  # a pooled connection, idle from now on
    own_redis.restart()
    # Redis lost what it held (no persistence): a miss, not a ConnectionError.
    assert cache.get("statistics") is None
    cache.set("statistics", 2)
    assert cache.get("statistics") == 2


def test_a_request_waits_for_a_stopped_redis_and_goes_on_once_it_is_back(own_redis: RedisServer):
    limiter = rate_limit.limiter_for(
        base_url="http://127.0.0.1:9/v1",
        concurrency=1,
        requests_per_minute=600,
        redis_url=own_redis.url,
    )
    with limiter.slot():
        pass  # this thread's connection, idle from now on
    own_redis.stop()
    waits: list[float] = []
    sent: list[float] = []
    failures: list[BaseException] = []

    def request() -> None:
        try:
            limiter.wait_turn(lambda: waits.append(time.monotonic()))
            with limiter.slot(lambda: waits.append(time.monotonic())):
                sent.append(time.monotonic())
        except BaseException as exc:  # what handed an episode back
            failures.append(exc)

    thread = threading.Thread(target=request)
    thread.start()
    time.sleep(3)
    assert sent == [] and failures == []
    assert len(waits) >= 2  # the caller's check (a cancel, a lost claim) ran while it waited
    own_redis.start()
    back = time.monotonic()
    thread.join(30)
    assert failures == [] and len(sent) == 1
    assert sent[0] - back < 2.0  # a pause between tries is 1 s at most
    assert limiter.in_flight() == 0


def test_a_caller_may_stop_waiting_for_redis(own_redis: RedisServer):
    limiter = rate_limit.limiter_for(
        base_url="http://127.0.0.1:9/v1",
        concurrency=1,
        requests_per_minute=0,
        redis_url=own_redis.url,
    )
    own_redis.stop()

    class Canceled(Exception):
        pass

    def canceled() -> None:
        raise Canceled

    with pytest.raises(Canceled), limiter.slot(canceled):
        pytest.fail("no slot without Redis")


@pytest.mark.django_db
def test_a_probe_question_waits_for_the_limiters_redis_and_is_asked_once(
    own_redis: RedisServer, chat_server, settings
):
    from probes.asking import ProbeAsker
    from rollouts.policies.openai import ChatOptions
    from rollouts.tests.openai_server import text

    settings.REDIS_URL = own_redis.url
    chat_server.default = text("cow")
    asker = ProbeAsker(ChatOptions(model="probe-model", base_url=chat_server.url), seed=0)
    own_redis.stop()
    asked = []
    question = [{"role": "user", "content": "A: grass or B: cow?"}]
    thread = threading.Thread(target=lambda: asked.append(asker.ask(question, ["grass", "cow"])))
    thread.start()
    time.sleep(2)
    assert chat_server.requests == [] and asked == []  # waiting, not failed
    own_redis.start()
    thread.join(30)
    assert [(a.choice, a.error_kind, a.requests) for a in asked] == [("cow", "", 1)]
    assert len(chat_server.requests) == 1


@pytest.mark.django_db
def test_a_chunk_canceled_while_the_limiters_redis_is_away_sends_nothing(
    own_redis: RedisServer, chat_server, settings
):
    from probes.asking import ProbeAsker
    from rollouts.policies.openai import ChatOptions
    from studio.jobs import ClaimLost

    settings.REDIS_URL = own_redis.url
    asker = ProbeAsker(ChatOptions(model="probe-model", base_url=chat_server.url), seed=0)

    def canceled() -> None:  # what the chunk's claim check says of a canceled run
        raise ClaimLost("canceled")

    asker.before_retry = canceled
    own_redis.stop()
    with pytest.raises(ClaimLost):
        asker.ask([{"role": "user", "content": "A: grass or B: cow?"}], ["grass", "cow"])
    assert chat_server.requests == []
