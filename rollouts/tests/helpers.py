"""Ways to make real rollout data in tests: the real services, the real recorder."""

from __future__ import annotations

import os
import threading
import time

import pytest
from django.db import connection

from rollouts.models import Episode, Frame, RolloutBatch, Turn
from rollouts.recording import services
from rollouts.rollout_settings import RolloutSettings
from studio.models import Endpoint

# The statuses a batch stops in: what a test waits for (`studio.testing.wait_for_row`).
BATCH_ENDS = (
    RolloutBatch.Status.FINISHED,
    RolloutBatch.Status.FAILED,
    RolloutBatch.Status.CANCELED,
)

# The Redis the tests share (make test sets it); tests of what lives in Redis skip without it.
REDIS_URL = os.environ.get("CELERY_BROKER_URL", "")
needs_redis = pytest.mark.skipif(
    not REDIS_URL.startswith("redis://"), reason="needs CELERY_BROKER_URL=redis://..."
)


def record_batch(**settings_kwargs) -> RolloutBatch:
    """Create a batch and play its episodes here, as `rollout --inline` does."""
    settings_kwargs.setdefault("policy", "scripted")
    return services.batch_run_inline(settings=RolloutSettings(**settings_kwargs))


def seed_episode(*, turns: int, observation: str, model_text: str) -> Episode:
    """An episode of `turns` turns written with bulk_create (no game played, no PNG stored):
    turn i's observation and model text are `observation` and `model_text` formatted with
    i, its frame's sha256 is sha256(str(i)) and each of its four vitals is i % 10."""
    import hashlib

    batch = services.batch_create(
        settings=RolloutSettings(policy="scripted", seeds=(1,), steps=turns), enqueue=False
    )
    episode = batch.episodes.get()
    frames = Frame.objects.bulk_create(
        Frame(
            episode=episode,
            step=i,
            sha256=hashlib.sha256(str(i).encode()).hexdigest(),
            image=f"frames/{i}.png",
            width=64,
            height=64,
            state={"vitals": dict.fromkeys(("health", "food", "drink", "energy"), i % 10)},
        )
        for i in range(turns)
    )
    Turn.objects.bulk_create(
        (
            Turn(
                episode=episode,
                index=i,
                frame=frame,
                observation_text=observation.format(i=i),
                model_text=model_text.format(i=i),
                actions=["noop"],
            )
            for i, frame in enumerate(frames)
        ),
        batch_size=2000,
    )
    Episode.objects.filter(id=episode.id).update(status=Episode.Status.FINISHED, steps=turns)
    episode.refresh_from_db()
    return episode


class EndpointDisabler:
    """An admin disabling `endpoint` from a thread of its own (its own connection, so the
    change is committed as a web request's would be) once `server` has received
    `after_requests` requests, while it answers the last of them.

    `at` is the moment the disable had committed; `requests_after(key)` the requests
    carrying `Authorization: Bearer <key>` that arrived later. Needs a transactional test.
    """

    def __init__(self, *, server, endpoint, after_requests: int) -> None:
        self.server, self.endpoint, self.after_requests = server, endpoint, after_requests
        self.at: float | None = None
        self._thread = threading.Thread(target=self._disable, daemon=True)
        self._thread.start()

    def _disable(self) -> None:
        try:
            deadline = time.monotonic() + 60
            while len(self.server.requests) < self.after_requests:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.005)
            Endpoint.objects.filter(id=self.endpoint.id).update(enabled=False)
            self.at = time.monotonic()
        finally:
            connection.close()

    def requests_after(self, key: str) -> list:
        self._thread.join(timeout=60)
        assert self.at is not None, "the endpoint was never disabled"
        bearer = f"Bearer {key}"
        return [
            received
            for received in self.server.requests
            if received.at > self.at and received.headers.get("authorization") == bearer
        ]
