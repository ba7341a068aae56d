"""Work that waits on a model goes to a queue of its own, which the demo gives a pool of
threads, while baselines stay on a process per core."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollouts.recording import services
from rollouts.rollout_settings import RolloutSettings
from rollouts.tests.helpers import needs_redis
from studio import demo
from studio.testing import queue_purge


def _waiting(name: str) -> int:
    from studio.celery import app

    with app.connection_for_write() as conn:
        return conn.default_channel.queue_declare(name).message_count


@needs_redis
@pytest.mark.django_db(transaction=True)
def test_it_sends_model_episodes_to_the_model_queue_and_baselines_to_the_default(
    chat_endpoint,
):
    queue_purge()
    try:
        services.batch_create(
            settings=RolloutSettings(
                policy="openai",
                model="m",
                endpoint=chat_endpoint.name,
                base_url=chat_endpoint.base_url,
                seeds=(0, 1, 2),
                steps=2,
            )
        )
        services.batch_create(settings=RolloutSettings(policy="scripted", seeds=(0, 1), steps=2))
        assert (_waiting("studio-model"), _waiting("celery")) == (3, 2)
    finally:
        queue_purge()


def _queues(command: list[str]) -> set[str]:
    return set(command[command.index("-Q") + 1].split(",")) if "-Q" in command else set()


def test_the_demo_plays_model_work_on_a_pool_of_threads_and_baselines_on_processes(settings):
    workers = {
        name: command
        for name, command in demo._commands("8000", Path("/tmp/var")).items()
        if "worker" in command
    }
    model = [c for c in workers.values() if "studio-model" in _queues(c)]
    cores = [c for c in workers.values() if "celery" in _queues(c)]
    assert len(model) == 1 and len(cores) == 1, workers
    assert "--pool=threads" in model[0] and "--concurrency=16" in model[0]
    assert not any(arg.startswith("--pool") for arg in cores[0])  # prefork: a process a core
    assert "--concurrency=2" in cores[0]
    # Between them, every queue the studio declares is consumed, the control queue included.
    assert set().union(*map(_queues, workers.values())) == {
        "celery",
        "studio-control",
        "studio-model",
    }
