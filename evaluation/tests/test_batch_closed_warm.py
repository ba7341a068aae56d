"""A closed batch is announced by rollouts (`batch_closed`), and evaluation, which connects to
it, warms its statistics: rollouts names no task or module of a later app."""

from __future__ import annotations

import pytest

from evaluation import tasks
from rollouts.recording import services
from rollouts.rollout_settings import RolloutSettings


@pytest.mark.django_db(transaction=True)
def test_the_episode_that_closes_a_batch_has_evaluation_warm_its_statistics(monkeypatch):
    sent: list[object] = []
    monkeypatch.setattr(tasks.queue, "send", lambda task, *args: sent.append(task) or True)
    closed: list[int] = []

    def heard(sender, batch_id, **kwargs):
        closed.append(batch_id)

    services.batch_closed.connect(heard)
    try:
        batch = services.batch_run_inline(
            settings=RolloutSettings(policy="scripted", seeds=(0, 1), steps=3)
        )
    finally:
        services.batch_closed.disconnect(heard)
    assert batch.status == "finished"
    assert closed == [batch.id]  # once, by the last episode to end
    assert sent == [tasks.statistics_warm]
