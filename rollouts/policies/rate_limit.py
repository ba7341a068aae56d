"""How many requests may be in flight, and how often, per model endpoint, across all workers.

A batch's episodes run as Celery tasks on many workers, each with many threads; the limits
of an endpoint (a provider's rate limit, a vLLM server's batch size) are for all of them
together. So the limiter lives in Redis:

* concurrency: a sorted set of slot leases (member = random token, score = expiry in Redis
  server time). A lease is short (`STUDIO_LIMITER_LEASE_SECONDS`, 10 s) and renewed by its
  holder while its request runs: one thread per process renews every lease the process
  holds (`_SlotKeeper`), however long the request takes. Taking a slot drops expired leases
  first, so the slots of a worker that died (killed, frozen, cut off) are free again within
  a lease, not after its requests' timeout. Releasing a slot pushes a token on a wake-up
  list; waiters block on it (BLPOP, served first come, first served across workers) instead
  of polling.
* requests per minute: a reservation clock (the "theoretical arrival time" of GCRA without
  burst): each request reserves the next free instant, 60 / rpm seconds after the previous
  one, and sleeps until then. Requests are spread evenly, never bunched at a minute boundary.

Both use Redis server time, so worker clocks need not agree. Without Redis (the embedded
broker of `make demo`), the same limits hold in-process, shared by that process's threads.

While Redis cannot be reached (restarting, stopped), a request waits for it before it is
sent, up to `STUDIO_LIMITER_OUTAGE_SECONDS`, and its episode keeps its claim and goes on
from the turn it was at. It does not go on without the limiter: the limits are a promise to
the endpoint's owner (a provider's rate limit, a vLLM server sized for so many requests at
once), and without Redis nobody knows how many requests the other workers have in flight.
A request already sent is not lost to an outage: its slot is left to expire.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol, TypeVar

from django.conf import settings as django_settings
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

logger = logging.getLogger(__name__)
T = TypeVar("T")
# Redis gone (refused, reset, restarting: BusyLoadingError is a ConnectionError) or silent.
REDIS_OUTAGES = (RedisConnectionError, RedisTimeoutError)

KEY_PREFIX = "studio:vlm-limit"
# A waiting request blocks on a wake-up list that each release pushes to (so waiters neither
# spin nor poll), and looks again at least this often: a dead worker's lease expires
# without anyone releasing it.
WAIT_SECONDS = 0.1

# A longest pause between two tries of a Redis that cannot be reached: a request goes on at
# most this long after Redis is back.
OUTAGE_PAUSE_MAX = 1.0

# The token is the caller's: a try sent again after a lost reply finds its lease taken.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[3]) then
  return 1
end
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
  redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2])) + 60)
  return 1
end
return 0
"""

_RELEASE = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('LPUSH', KEYS[2], '1')
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[2]) - 1)
redis.call('EXPIRE', KEYS[2], 600)
return 1
"""

# Leases still held (XX: a lease released meanwhile, or lost with a restarted Redis, is not
# written again) run `ARGV[1]` seconds from now.
_RENEW = """
local t = redis.call('TIME')
local until_then = tonumber(t[1]) + tonumber(t[2]) / 1000000 + tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', until_then, ARGV[i])
end
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[1])) + 60)
return 1
"""

_RESERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local interval = tonumber(ARGV[1])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local ttl = math.ceil((tat + interval - now) * 1000) + 60000
redis.call('SET', KEYS[1], tostring(tat + interval), 'PX', ttl)
return tostring(tat - now)
"""


# Called while a request waits for the limiter's Redis to come back: it may raise to stop
# waiting (the episode's batch was canceled, its claim lost).
OnWait = Callable[[], None] | None


class Limiter(Protocol):
    def slot(self, on_wait: OnWait = None) -> AbstractContextManager[None]: ...

    def reserve(self) -> float: ...

    def wait_turn(self, on_wait: OnWait = None) -> float: ...


def endpoint_key(base_url: str) -> str:
    """A short, stable name for an endpoint (a URL may be long; it is never a secret)."""
    normalized = (base_url or "default").strip().rstrip("/").lower()
    return hashlib.sha256(normalized.encode()).hexdigest()[:16]


class _LimiterBase:
    def __init__(self, *, base_url: str, concurrency: int, requests_per_minute: int) -> None:
        self.key = endpoint_key(base_url)
        self.concurrency = max(1, int(concurrency))
        self.requests_per_minute = max(0, int(requests_per_minute))

    def wait_turn(self, on_wait: OnWait = None) -> float:
        """Sleep until this request may start under the per-minute limit; return the wait."""
        wait = self._reserve_turn(on_wait)
        if wait > 0:
            time.sleep(wait)
        return wait

    def _reserve_turn(self, on_wait: OnWait) -> float:
        return self.reserve()

    def reserve(self) -> float:
        raise NotImplementedError


class RedisLimiter(_LimiterBase):
    """Limits shared by every worker that talks to the same Redis."""

    def __init__(
        self,
        *,
        client,
        base_url: str,
        concurrency: int,
        requests_per_minute: int,
        lease_seconds: float,
        outage_seconds: float | None = None,
    ) -> None:
        super().__init__(
            base_url=base_url, concurrency=concurrency, requests_per_minute=requests_per_minute
        )
        self.client = client
        self.lease_seconds = float(lease_seconds)
        if outage_seconds is None:
            outage_seconds = django_settings.STUDIO_LIMITER_OUTAGE_SECONDS
        self.outage_seconds = float(outage_seconds)
        self._acquire = client.register_script(_ACQUIRE)
        self._release = client.register_script(_RELEASE)
        self._renew = client.register_script(_RENEW)
        self._reserve = client.register_script(_RESERVE)
        self.slots_key = f"{KEY_PREFIX}:{self.key}:slots"
        self.wake_key = f"{KEY_PREFIX}:{self.key}:wake"
        self.rate_key = f"{KEY_PREFIX}:{self.key}:rate"

    def try_acquire(self, token: str | None = None) -> str | None:
        token = token or uuid.uuid4().hex
        taken = self._acquire(
            keys=[self.slots_key],
            args=[self.concurrency, self.lease_seconds, token],
            client=_own_client(self.client),
        )
        return token if int(taken) == 1 else None

    def release(self, token: str) -> None:
        self._release(
            keys=[self.slots_key, self.wake_key],
            args=[token, self.concurrency],
            client=_own_client(self.client),
        )

    def renew(self, tokens: list[str], client=None) -> None:
        """Run these leases (those still held) a whole lease from now."""
        self._renew(
            keys=[self.slots_key],
            args=[self.lease_seconds, *tokens],
            client=client or _own_client(self.client),
        )

    @contextmanager
    def slot(self, on_wait: OnWait = None) -> Iterator[None]:
        """Hold one of the endpoint's concurrent-request slots for the duration; its lease is
        renewed by this process's keeper meanwhile. Waits out a Redis that cannot be reached
        (`on_wait` called between tries)."""
        token = uuid.uuid4().hex
        while self._through_outage(lambda: self.try_acquire(token), on_wait) is None:
            self._through_outage(
                lambda: _own_client(self.client).blpop([self.wake_key], timeout=WAIT_SECONDS),
                on_wait,
            )
        _slot_keeper().hold(token, self)
        try:
            yield
        finally:
            _slot_keeper().let_go(token)
            try:
                self.release(token)
            except REDIS_OUTAGES:
                # The request is over: its answer is not thrown away for the slot. The lease
                # expires by itself within `lease_seconds` (or went with a restarted Redis).
                logger.warning("model limiter: Redis unreachable, a slot is left to expire")

    def in_flight(self) -> int:
        return int(self.client.zcard(self.slots_key))

    def _reserve_turn(self, on_wait: OnWait) -> float:
        return self._through_outage(self.reserve, on_wait)

    def reserve(self) -> float:
        if not self.requests_per_minute:
            return 0.0
        wait = self._reserve(
            keys=[self.rate_key],
            args=[60.0 / self.requests_per_minute],
            client=_own_client(self.client),
        )
        return max(0.0, float(wait))

    def _through_outage(self, command: Callable[[], T], on_wait: OnWait) -> T:
        """`command()`, tried again while Redis cannot be reached, up to `outage_seconds`;
        then the error goes to the caller (an episode is handed back, to resume later)."""
        deadline = None
        pause = 0.25
        while True:
            try:
                return command()
            except REDIS_OUTAGES:
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.outage_seconds
                    logger.warning(
                        "model limiter: Redis unreachable, requests wait for it (up to %g s)",
                        self.outage_seconds,
                    )
                if now >= deadline:
                    raise
            if on_wait is not None:
                on_wait()
            time.sleep(pause)
            pause = min(pause * 2, OUTAGE_PAUSE_MAX)


class _SlotKeeper:
    """This process's hold on the slot leases its requests have: one thread renews them all,
    every third of a lease, whatever the requests do (the shape of `studio.claim_keeper`'s
    keeper, on Redis). Holding and letting go cost a dict update each, nothing in Redis."""

    def __init__(self) -> None:
        self._held: dict[str, RedisLimiter] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._every = 3600.0
        self._sooner = threading.Event()

    def hold(self, token: str, limiter: RedisLimiter) -> None:
        with self._lock:
            self._held[token] = limiter
            every = max(0.05, limiter.lease_seconds / 3)
            if every < self._every:  # a shorter lease than any before: not one sleep more
                self._every = every
                self._sooner.set()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._renew_forever, name="model-slot-keeper", daemon=True
                )
                self._thread.start()

    def let_go(self, token: str) -> None:
        with self._lock:
            self._held.pop(token, None)

    def renew_held(self) -> int:
        """Renew every lease held now (one command per endpoint and Redis); how many."""
        with self._lock:
            held = dict(self._held)
        by_key: dict[tuple[int, str], tuple[RedisLimiter, list[str]]] = {}
        for token, limiter in held.items():
            key = (id(limiter.client.connection_pool), limiter.slots_key)
            by_key.setdefault(key, (limiter, []))[1].append(token)
        for limiter, tokens in by_key.values():
            try:
                limiter.renew(tokens)
            except REDIS_OUTAGES:  # their requests wait for it too; the next round tries
                logger.warning(
                    "model limiter: Redis unreachable, %d slots not renewed", len(tokens)
                )
        return len(held)

    def _renew_forever(self) -> None:
        while True:
            self._sooner.wait(self._every)
            self._sooner.clear()
            try:
                self.renew_held()
            except Exception:  # never the end of the renewals: the next round tries again
                logger.exception("model limiter: renewing slot leases failed")


_keeper_state: dict[int, _SlotKeeper] = {}
_keeper_lock = threading.Lock()


def _slot_keeper() -> _SlotKeeper:
    # One per process: a forked child has none of its parent's threads, so one of its own.
    pid = os.getpid()
    keeper = _keeper_state.get(pid)
    if keeper is None:
        with _keeper_lock:
            keeper = _keeper_state.setdefault(pid, _SlotKeeper())
    return keeper


_threads = threading.local()


def _own_client(client):
    """`client`, on a connection of this thread's own, taken from its pool once and kept.

    Every model call takes and releases a slot: two commands. Through the shared pool each
    one would also take the pool's lock, check the connection it was lent and give it back,
    which with many threads calling at once costs more CPU than the commands themselves. A
    worker's threads live as long as it does; a thread's client goes back to the pool when
    it ends.
    """
    pid = os.getpid()
    if getattr(_threads, "pid", None) != pid:
        # A forked child keeps the forking thread's locals, and its parent's sockets with
        # them: never use those.
        _threads.pid, _threads.clients = pid, {}
    pool = client.connection_pool
    own = _threads.clients.get(id(pool))  # the client keeps its pool, so the id stays its own
    if own is None:
        import redis

        own = _threads.clients[id(pool)] = redis.Redis(
            connection_pool=pool, single_connection_client=True
        )
    return own


class _ProcessState:
    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.in_flight = 0
        self.next_free = 0.0


class LocalLimiter(_LimiterBase):
    """The same limits for the threads of one process (no Redis configured)."""

    _states: dict[str, _ProcessState] = {}
    _states_lock = threading.Lock()

    def __init__(self, *, base_url: str, concurrency: int, requests_per_minute: int) -> None:
        super().__init__(
            base_url=base_url, concurrency=concurrency, requests_per_minute=requests_per_minute
        )
        with self._states_lock:
            self.state = self._states.setdefault(self.key, _ProcessState())

    @contextmanager
    def slot(self, on_wait: OnWait = None) -> Iterator[None]:
        state = self.state
        with state.lock:
            while state.in_flight >= self.concurrency:
                state.lock.wait()
            state.in_flight += 1
        try:
            yield
        finally:
            with state.lock:
                state.in_flight -= 1
                state.lock.notify()

    def in_flight(self) -> int:
        return self.state.in_flight

    def reserve(self) -> float:
        if not self.requests_per_minute:
            return 0.0
        with self.state.lock:
            now = time.monotonic()
            start = max(self.state.next_free, now)
            self.state.next_free = start + 60.0 / self.requests_per_minute
            return start - now


_clients: dict[str, object] = {}
_clients_lock = threading.Lock()

# A connection idle this long is checked (PING) before its next command; a command whose
# connection turns out broken is sent again on a new one, twice at most, a moment apart.
# Each worker thread keeps its connection between model calls (`_own_client`): after a
# Redis restart every one of them is dead, and without this the next slot taken or released
# on it would fail its episode. Retrying is safe: taking a slot writes the same token
# again, releasing one removes it again (and wakes a waiter more).
HEALTH_CHECK_SECONDS = 10


def redis_connection_options() -> dict:
    """What the limiter's Redis connections are opened with (the cache's are alike:
    `CACHES` in `studio.settings`)."""
    from redis.backoff import ExponentialBackoff
    from redis.retry import Retry

    return {
        "health_check_interval": HEALTH_CHECK_SECONDS,
        "retry": Retry(
            ExponentialBackoff(cap=0.5, base=0.25), 2, supported_errors=(RedisConnectionError,)
        ),
    }


def redis_client(url: str):
    # One client (and connection pool) per URL and process; redis-py's pool is thread-safe
    # and notices a fork, so Celery's prefork children get their own connections.
    with _clients_lock:
        client = _clients.get(url)
        if client is None:
            import redis

            client = redis.Redis.from_url(
                url, socket_timeout=10, socket_connect_timeout=5, **redis_connection_options()
            )
            _clients[url] = client
        return client


def limiter_for(
    *,
    base_url: str,
    concurrency: int,
    requests_per_minute: int,
    lease_seconds: float | None = None,
    redis_url: str | None = None,
) -> RedisLimiter | LocalLimiter:
    """The limiter for an endpoint: in Redis when one is configured, else in this process."""
    if lease_seconds is None:
        lease_seconds = django_settings.STUDIO_LIMITER_LEASE_SECONDS
    url = django_settings.REDIS_URL if redis_url is None else redis_url
    if url and url.startswith(("redis://", "rediss://", "unix://")):
        return RedisLimiter(
            client=redis_client(url),
            base_url=base_url,
            concurrency=concurrency,
            requests_per_minute=requests_per_minute,
            lease_seconds=lease_seconds,
        )
    return LocalLimiter(
        base_url=base_url, concurrency=concurrency, requests_per_minute=requests_per_minute
    )
