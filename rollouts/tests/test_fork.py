"""Forks: replay an episode to turn K (sha256-guarded), then play on with another policy."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from rollouts.game.crafter_env import ACTION_INDEX, StudioEnv, encode_png
from rollouts.models import Episode, RolloutBatch
from rollouts.play import forks as services_fork
from rollouts.play import services as services_play
from rollouts.review import services as services_review
from rollouts.rollout_settings import DEFAULT_SCRIPT, RolloutSettings
from rollouts.tests.helpers import record_batch
from studio.testing import manage, subprocess_env, wait_for_row

SUMMARY_KEYS = {"episode_id", "batch_id", "forked_from", "turn", "status", "steps"}


def _inline_hashes(actions, *, seed, steps, size=64) -> list[str]:
    env = StudioEnv(seed=seed, size=size, length=steps)
    frames = [env.reset()]
    for action in actions:
        frames.append(env.step(ACTION_INDEX[action])[0])
    return [hashlib.sha256(encode_png(f).png).hexdigest() for f in frames]


def _hashes(episode: Episode) -> list[str]:
    return list(episode.frames.order_by("step").values_list("sha256", flat=True))


def _actions(episode: Episode) -> list[list[str]]:
    return list(episode.turns.order_by("index").values_list("actions", flat=True))


def _frame_files(media: str) -> set[str]:
    return {p.name for p in Path(media).rglob("*.png")}


def _scripted(seed=4, steps=60) -> Episode:
    return record_batch(policy="scripted", seeds=(seed,), steps=steps).episodes.get()


def _fork_settings(source: Episode, policy: str, **kwargs) -> RolloutSettings:
    return services_fork.fork_settings(
        source=source, settings=RolloutSettings(policy=policy, **kwargs), steps=None
    )


@pytest.mark.django_db(transaction=True)
def test_a_fork_at_turn_40_replays_the_original_then_plays_its_own_policy(media_storage):
    original = _scripted()
    files_before = _frame_files(media_storage)
    result = manage(
        "fork_episode",
        str(original.id),
        "--turn",
        "40",
        "--policy",
        "random",
        "--inline",
        env=subprocess_env(STUDIO_MEDIA_ROOT=media_storage),
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(summary) == SUMMARY_KEYS
    fork = Episode.objects.get(id=summary["episode_id"])
    assert summary == {
        "episode_id": fork.id,
        "batch_id": fork.batch_id,
        "forked_from": original.id,
        "turn": 40,
        "status": "finished",
        "steps": 60,
    }
    assert fork.batch.policy == "random" and fork.forked_from_id == original.id
    assert (fork.forked_at_turn, fork.fork_prefix_turns) == (40, 40)
    ours, theirs = _hashes(fork), _hashes(original)
    assert ours[:41] == theirs[:41]
    assert len(ours) == 61
    script = [[DEFAULT_SCRIPT[i % 5]] for i in range(60)]
    assert _actions(original) == script
    played = _actions(fork)
    assert played[:40] == script[:40]
    assert played[40:] != script[40:]  # the random policy, not the script
    # The whole fork is crafter's game for those actions.
    assert ours == _inline_hashes([a for turn in played for a in turn], seed=4, steps=60)
    # The replayed prefix stored no image: only the fork's own new frames are new files.
    new_files = _frame_files(media_storage) - files_before
    assert new_files == {f"{sha}.png" for sha in set(ours[41:]) - set(theirs)}


@pytest.mark.django_db(transaction=True)
def test_a_fork_of_an_episode_with_tampered_frames_fails_with_the_sha256_error(media_storage):
    original = _scripted(seed=6, steps=30)
    real = original.frames.get(step=12).sha256
    original.frames.filter(step=12).update(sha256="ab" * 32)
    result = manage(
        "fork_episode",
        str(original.id),
        "--turn",
        "20",
        "--policy",
        "scripted",
        "--inline",
        env=subprocess_env(STUDIO_MEDIA_ROOT=media_storage),
    )
    assert result.returncode == 1
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["status"] == "failed"
    fork = Episode.objects.get(id=summary["episode_id"])
    assert f"step 12 has sha256 {real}" in fork.error
    assert "ab" * 32 in fork.error
    assert "sha256" in result.stderr.strip().splitlines()[-1]
    assert fork.turns.count() == 0 and fork.frames.count() == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--turn", "99", "--policy", "random"], "there is no turn 99"),
        (["--turn", "3", "--policy", "telepathy"], "invalid choice"),
        (["--turn", "3"], "--policy is required"),
        (["--turn", "3", "--policy", "random", "--steps", "2"], "step limit (2) must be higher"),
        (["--turn", "3", "--policy", "random", "--with-correction"], "has no correction"),
        (["--turn", "3", "--policy", "openai"], "needs --model"),
    ],
)
@pytest.mark.django_db(transaction=True)
def test_it_refuses_bad_input_with_one_line_and_writes_nothing(media_storage, args, message):
    original = _scripted(seed=1, steps=10)
    batches = RolloutBatch.objects.count()
    result = manage("fork_episode", str(original.id), *args, "--inline", env=subprocess_env())
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert result.stdout == ""
    assert RolloutBatch.objects.count() == batches


@pytest.mark.django_db
def test_a_fork_with_the_correction_plays_the_corrected_actions_at_the_fork_turn(editor):
    original = _scripted(seed=2, steps=40)
    turn = original.turns.get(index=10)
    services_review.turn_relabel(turn=turn, actions=["noop", "do"], reason="", user=editor)
    fork = services_fork.episode_fork(
        source=original,
        turn=10,
        settings=_fork_settings(original, "scripted", actions=("move_left",)),
        with_correction=True,
        enqueue=False,
    )
    from rollouts.recording import services

    assert services.episode_run(episode_id=fork.id) == "finished"
    fork.refresh_from_db()
    assert fork.fork_with_correction and fork.fork_prefix_turns == 11
    played = _actions(fork)
    assert played[10] == ["noop", "do"]
    assert played[11:] == [["move_left"]] * (len(played) - 11)
    flat = [a for t in played for a in t]
    assert _hashes(fork) == _inline_hashes(flat, seed=2, steps=40)
    assert _hashes(fork)[:11] == _hashes(original)[:11]
    assert fork.turns.get(index=10).model_text is None


@pytest.mark.django_db
def test_a_person_forks_and_plays_on_from_the_fork_point(editor):
    original = _scripted(seed=3, steps=30)
    fork = services_fork.episode_fork(
        source=original, turn=7, settings=_fork_settings(original, "human"), created_by=editor
    )
    assert fork.status == Episode.Status.RUNNING
    assert fork.turns.count() == 7 and fork.steps == 7
    for turn, action in enumerate(["do", "move_up", "noop"], start=7):
        services_play.play_step(episode_id=fork.id, action=action, turn=turn)
    played = [a for t in _actions(fork) for a in t]
    assert played == [DEFAULT_SCRIPT[i % 5] for i in range(7)] + ["do", "move_up", "noop"]
    assert _hashes(fork) == _inline_hashes(played, seed=3, steps=30)


def test_a_fork_runs_on_the_worker(celery_worker):
    original = _scripted(seed=8, steps=20)
    fork = services_fork.episode_fork(
        source=original, turn=5, settings=_fork_settings(original, "random")
    )
    wait_for_row(fork, statuses=(Episode.Status.FINISHED, Episode.Status.FAILED))
    assert fork.status == Episode.Status.FINISHED, fork.error
    assert _hashes(fork)[:6] == _hashes(original)[:6]
    assert fork.steps == 20
