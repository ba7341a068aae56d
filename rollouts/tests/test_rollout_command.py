"""`manage.py rollout` as a user runs it: a real process, a real broker, a real worker."""

from __future__ import annotations

import json
import os

import pytest
from django.core.management import call_command

from rollouts.models import Episode, Frame, RolloutBatch, Turn
from rollouts.tests.helpers import record_batch
from studio.testing import (
    backdate,
    celery_worker_running,
    manage,
    start_python,
    subprocess_env,
    wait_until,
)

SUMMARY_KEYS = {
    "batch_id",
    "episodes",
    "finished",
    "failed",
    "mean_steps",
    "mean_achievements",
    "crafter_score",
    "total_tool_calls",
}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "random", "--seeds", "x"], "seeds: 'x' is not a seed"),
        (["--policy", "random", "--seeds", "5-2"], "ends before it starts"),
        (["--policy", "random", "--steps", "0"], "steps: 0 is not between"),
        (["--policy", "scripted", "--actions", "jump"], "unknown action 'jump'"),
        (["--policy", "telepathy"], "invalid choice: 'telepathy'"),
        (["--policy", "random", "--steps", "many"], "invalid int value: 'many'"),
        (["--policy", "openai"], "the openai policy needs --model"),
        # crafter 1.8.3 itself raises at reset() for 17 px and less (see rollout_settings)
        (["--policy", "random", "--image-size", "17"], "image-size: 17 is not between 18"),
        (["--policy", "random", "--image-size", "9"], "image-size: 9 is not between 18"),
        (
            ["--policy", "openai", "--model", "m", "--endpoint", "nope"],
            "endpoint: no chat endpoint named 'nope'",
        ),
        (
            ["--policy", "openai", "--model", "m", "--endpoint", "x", "--base-url", "http://h/v1"],
            "give --endpoint or --base-url, not both",
        ),
        (["--seeds", "1"], "--policy is required"),
    ],
)
def test_it_refuses_bad_input_with_one_line_and_writes_nothing(transactional_db, args, message):
    result = manage("rollout", *args, "--inline", env=subprocess_env())
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0]
    assert result.stdout == ""
    assert RolloutBatch.objects.count() == Episode.objects.count() == 0


def test_it_plays_inline_and_prints_the_summary_last(transactional_db):
    result = manage(
        "rollout",
        "--policy",
        "scripted",
        "--seeds",
        "1,3-4",
        "--steps",
        "30",
        "--inline",
        env=subprocess_env(),
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(summary) >= SUMMARY_KEYS
    assert (summary["episodes"], summary["finished"], summary["failed"]) == (3, 3, 0)
    assert summary["mean_steps"] == 30
    batch = RolloutBatch.objects.get(id=summary["batch_id"])
    assert batch.seeds == [1, 3, 4]
    assert batch.status == RolloutBatch.Status.FINISHED
    assert batch.crafter_version == "1.8.3"
    assert batch.numpy_version and batch.opensimplex_version
    assert Turn.objects.filter(episode__batch=batch).count() == 90


def test_it_runs_episodes_on_a_celery_worker_and_waits(celery_worker, capsys):
    call_command("rollout", "--policy", "random", "--seeds", "0-3", "--steps", "25", "--wait")
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["episodes"], summary["finished"], summary["failed"]) == (4, 4, 0)
    batch = RolloutBatch.objects.get(id=summary["batch_id"])
    assert batch.status == RolloutBatch.Status.FINISHED
    assert batch.episodes_finished == 4
    assert Turn.objects.filter(episode__batch=batch).count() == 100


# The seed whose game lasts longest doing nothing (263 steps; seed 5 dies at 161), and a
# transaction per turn: the worker is still playing when the test sees its first turns and
# kills it, however fast it records (a 161-step game in chunks of 4 could end before the
# command that enqueued it had exited).
KILLED_SEED = 25
KILLED_GAME_STEPS = 263
KILLED_STEPS = 600


def test_it_recovers_from_a_worker_killed_mid_episode(transactional_db, settings):
    """SIGKILL a worker while it records; re-running the batch leaves one copy of every turn."""
    broker = os.environ["CELERY_BROKER_URL"]
    env = subprocess_env(STUDIO_RECORD_CHUNK="1", CELERY_BROKER_URL=broker)
    rollout = ["--policy", "scripted", "--actions", "noop", "--seeds", str(KILLED_SEED)]
    with celery_worker_running(process=True, env=env) as worker:
        command = start_python(
            "manage.py", "rollout", *rollout, "--steps", str(KILLED_STEPS), env=env
        )
        try:
            # Watched from the moment the batch exists, not from when its command has exited.
            wait_until(
                lambda: Turn.objects.filter(episode__seed=KILLED_SEED).count() >= 8,
                timeout=120,
                every=0.005,
                what="the worker to start recording",
            )
        finally:
            worker.kill_all()
            started = command.communicate_all()
    assert started.returncode == 0, started.stderr
    batch_id = json.loads(started.stdout.strip().splitlines()[-1])["batch_id"]
    episode = Episode.objects.get(batch_id=batch_id)
    assert episode.status == Episode.Status.RUNNING
    partial = Turn.objects.filter(episode=episode).count()
    assert 0 < partial < KILLED_GAME_STEPS

    # The dead worker's claim goes stale; the re-run takes the episode over and starts afresh.
    backdate(episode, field="heartbeat_at", seconds=settings.STUDIO_EPISODE_STALE_SECONDS + 1)
    call_command("rollout", "--resume", str(batch_id), "--inline")
    episode.refresh_from_db()
    assert episode.status == Episode.Status.FINISHED
    assert episode.attempts == 2
    indexes = list(
        Turn.objects.filter(episode=episode).order_by("index").values_list("index", flat=True)
    )
    assert indexes == list(range(episode.steps))
    steps = list(
        Frame.objects.filter(episode=episode).order_by("step").values_list("step", flat=True)
    )
    assert steps == list(range(episode.steps + 1))
    batch = RolloutBatch.objects.get(id=batch_id)
    assert (batch.episodes_finished, batch.episodes_failed, batch.status) == (1, 0, "finished")

    clean = record_batch(
        policy="scripted", actions=("noop",), seeds=(KILLED_SEED,), steps=KILLED_STEPS
    ).episodes.get()
    assert clean.steps == episode.steps
    assert list(clean.frames.values_list("sha256", flat=True)) == list(
        episode.frames.values_list("sha256", flat=True)
    )


def test_it_resumes_a_batch_on_the_worker(celery_worker, settings, capsys):
    """An episode whose worker died (stale claim) and one never sent: --resume finishes both."""
    from datetime import timedelta

    from django.utils import timezone

    from rollouts.recording import services
    from rollouts.rollout_settings import RolloutSettings

    settings.STUDIO_EPISODE_STALE_SECONDS = 60
    batch = services.batch_create(
        settings=RolloutSettings(policy="random", seeds=(1, 2), steps=15), enqueue=False
    )
    dead = batch.episodes.get(seed=1)
    assert services.episode_claim(episode_id=dead.id) is not None
    Episode.objects.filter(id=dead.id).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    call_command("rollout", "--resume", str(batch.id), "--wait")
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["batch_id"], summary["finished"], summary["failed"]) == (batch.id, 2, 0)
    assert Episode.objects.get(id=dead.id).attempts == 2
    assert Turn.objects.filter(episode__batch=batch).count() == 30
