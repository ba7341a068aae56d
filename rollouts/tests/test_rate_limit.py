"""The per-endpoint limiter: shared through real Redis by every worker, or in-process."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import redis

from rollouts.policies.rate_limit import LocalLimiter, RedisLimiter, limiter_for
from rollouts.tests.helpers import REDIS_URL, needs_redis

# Only the tests of the shared limiter need Redis (`needs_redis`); the in-process one runs
# anywhere.


@pytest.fixture
def endpoint() -> str:
    return f"http://limit-test-{uuid.uuid4().hex}/v1"


def worker_limiter(endpoint: str, *, concurrency: int = 2, rpm: int = 0, lease: float = 30):
    """A limiter with its own Redis connection, as a separate worker process would have."""
    return RedisLimiter(
        client=redis.Redis.from_url(REDIS_URL),
        base_url=endpoint,
        concurrency=concurrency,
        requests_per_minute=rpm,
        lease_seconds=lease,
    )


@needs_redis
def test_it_shares_the_concurrency_limit_between_workers(endpoint):
    first, second = worker_limiter(endpoint), worker_limiter(endpoint)
    a = first.try_acquire()
    b = second.try_acquire()
    assert a and b
    assert first.try_acquire() is None and second.try_acquire() is None
    second.release(a)
    assert first.try_acquire() is not None
    assert first.in_flight() == second.in_flight() == 2


@needs_redis
def test_it_never_lets_more_requests_in_than_the_limit(endpoint):
    limiters = [worker_limiter(endpoint, concurrency=3) for _ in range(2)]
    lock = threading.Lock()
    inside = peak = done = 0

    def request(limiter) -> None:
        nonlocal inside, peak, done
        for _ in range(5):
            with limiter.slot():
                with lock:
                    inside += 1
                    peak = max(peak, inside)
                time.sleep(0.03)
                with lock:
                    inside -= 1
                    done += 1

    threads = [threading.Thread(target=request, args=(limiters[i % 2],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert done == 40
    # 8 threads want 3 slots for 30 ms each: all 3 fill (a limiter that serialised requests
    # would give 1), never a 4th.
    assert peak == 3
    assert limiters[0].in_flight() == 0


@needs_redis
def test_it_frees_the_slot_of_a_worker_that_died(endpoint):
    dead = worker_limiter(endpoint, concurrency=1, lease=0.3)
    assert dead.try_acquire() is not None  # never released
    alive = worker_limiter(endpoint, concurrency=1, lease=0.3)
    assert alive.try_acquire() is None
    time.sleep(0.5)
    assert alive.try_acquire() is not None


@needs_redis
def test_it_spaces_requests_evenly_under_a_per_minute_limit(endpoint):
    first, second = worker_limiter(endpoint, rpm=60), worker_limiter(endpoint, rpm=60)
    waits = [first.reserve(), second.reserve(), first.reserve()]
    # Reservations, computed by Redis: one a second, whichever worker asks.
    assert waits[0] < 0.5
    assert 0.5 < waits[1] <= 1.0
    assert 1.5 < waits[2] <= 2.0
    assert worker_limiter(endpoint, rpm=0).reserve() == 0.0


def test_it_limits_in_process_without_redis(endpoint):
    limiter = limiter_for(
        base_url=endpoint, concurrency=2, requests_per_minute=30, lease_seconds=30, redis_url=""
    )
    assert isinstance(limiter, LocalLimiter)
    other = limiter_for(
        base_url=endpoint, concurrency=2, requests_per_minute=30, lease_seconds=30, redis_url=""
    )
    lock = threading.Lock()
    inside = peak = 0

    def request(lim) -> None:
        nonlocal inside, peak
        with lim.slot():
            with lock:
                inside += 1
                peak = max(peak, inside)
            time.sleep(0.05)
            with lock:
                inside -= 1

    threads = [threading.Thread(target=request, args=((limiter, other)[i % 2],)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Two limiters for one endpoint in one process share its 2 slots: both fill, never 3.
    assert peak == 2 and limiter.in_flight() == 0
    waits = [limiter.reserve(), other.reserve()]
    assert waits[0] < 1.0 and 1.0 < waits[1] <= 2.0 + waits[0]


@needs_redis
def test_it_uses_redis_when_the_broker_is_redis(endpoint, settings):
    settings.REDIS_URL = REDIS_URL
    limiter = limiter_for(base_url=endpoint, concurrency=4, requests_per_minute=0, lease_seconds=30)
    assert isinstance(limiter, RedisLimiter)
    with limiter.slot():
        assert limiter.in_flight() == 1
    assert limiter.in_flight() == 0


@needs_redis
def test_each_thread_keeps_one_connection_and_gives_it_back_when_it_ends(endpoint):
    limiter = worker_limiter(endpoint, concurrency=8)
    pool = limiter.client.connection_pool
    called = threading.Barrier(9)
    go_on = threading.Event()

    def request() -> None:
        with limiter.slot():
            pass
        called.wait(10)
        go_on.wait(10)

    for _ in range(2):
        go_on.clear()
        threads = [threading.Thread(target=request) for _ in range(8)]
        for thread in threads:
            thread.start()
        called.wait(10)
        # Between calls, each living thread keeps its connection (a shared pool's connection
        # would be back in the pool after every command).
        assert len(pool._in_use_connections) == 8
        go_on.set()
        for thread in threads:
            thread.join()
        # An ended thread's connection is back in the pool, for the next threads to take:
        # two rounds of 8 threads open 8 connections, not 16.
        assert len(pool._in_use_connections) == 0
        assert len(pool._available_connections) == 8
    assert limiter.in_flight() == 0


@needs_redis
def test_a_forked_child_opens_its_own_connection(endpoint):
    import multiprocessing

    from rollouts.policies.rate_limit import _own_client

    limiter = worker_limiter(endpoint, concurrency=4)
    with limiter.slot():
        pass
    parent_port = _own_client(limiter.client).connection._sock.getsockname()[1]
    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe()

    def child() -> None:
        with limiter.slot():
            theirs.send(_own_client(limiter.client).connection._sock.getsockname()[1])

    process = context.Process(target=child)
    process.start()
    assert ours.poll(10)
    child_port = ours.recv()
    process.join(10)
    assert process.exitcode == 0
    # The child talked to Redis on a socket of its own; the parent's still answers it.
    assert child_port != parent_port
    with limiter.slot():
        assert limiter.in_flight() == 1
    assert limiter.in_flight() == 0


@needs_redis
def test_a_slot_held_longer_than_its_lease_stays_held_while_its_holder_lives(endpoint):
    holder = worker_limiter(endpoint, concurrency=1, lease=0.3)
    other = worker_limiter(endpoint, concurrency=1, lease=0.3)
    with holder.slot():  # a request of 1.2 s: four leases long
        for _ in range(4):
            time.sleep(0.3)
            assert other.try_acquire() is None  # renewed by the holder's process
    assert other.try_acquire() is not None


@needs_redis
def test_a_killed_workers_slots_are_free_within_a_lease(endpoint, settings):
    import multiprocessing
    import os
    import signal

    settings.REDIS_URL = REDIS_URL
    settings.STUDIO_LIMITER_LEASE_SECONDS = 0.5  # at the default, 10 s
    context = multiprocessing.get_context("fork")
    taken = context.Event()

    def worker() -> None:  # holds every slot of the endpoint, in requests that never end
        limiter = limiter_for(base_url=endpoint, concurrency=2, requests_per_minute=0)
        held = [limiter.slot(), limiter.slot()]
        for slot in held:
            slot.__enter__()
        taken.set()
        time.sleep(60)

    process = context.Process(target=worker)
    process.start()
    assert taken.wait(10)
    survivor = limiter_for(base_url=endpoint, concurrency=2, requests_per_minute=0)
    time.sleep(1.0)  # two leases: the live holder renewed them
    assert survivor.in_flight() == 2 and survivor.try_acquire() is None
    os.kill(process.pid, signal.SIGKILL)
    process.join(10)
    killed = time.monotonic()
    while survivor.try_acquire() is None:
        assert time.monotonic() - killed < 1.0, "a dead worker's slot outlived its lease"
        time.sleep(0.02)
    assert survivor.try_acquire() is not None  # both of them


@needs_redis
def test_one_thread_renews_every_slot_of_a_process(endpoint):
    limiter = worker_limiter(endpoint, concurrency=8, lease=0.3)
    inside = threading.Barrier(9)

    def request() -> None:
        with limiter.slot():
            inside.wait(10)
            inside.wait(10)

    threads = [threading.Thread(target=request) for _ in range(8)]
    for thread in threads:
        thread.start()
    inside.wait(10)
    time.sleep(0.5)
    keepers = [t for t in threading.enumerate() if t.name == "model-slot-keeper"]
    assert len(keepers) == 1 and limiter.in_flight() == 8
    inside.wait(10)
    for thread in threads:
        thread.join()
    assert limiter.in_flight() == 0
