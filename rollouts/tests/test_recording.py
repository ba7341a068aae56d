"""Recording an episode: frames, turns, dedup, idempotency."""

from __future__ import annotations

import gc

import crafter
import numpy as np
import pytest
from django.core.files.storage import default_storage

from rollouts.game.crafter_env import ACTION_INDEX, decode_png
from rollouts.models import Episode, Frame, RolloutBatch, Turn
from rollouts.recording import services
from rollouts.recording.frame_store import FrameStore
from rollouts.rollout_settings import DEFAULT_SCRIPT
from rollouts.tests.helpers import record_batch

pytestmark = pytest.mark.django_db


# Stock crafter balances creatures every 10 steps and may then despawn one chosen in memory
# address order (what crafter_env fixes), after which it is no fixed reference to compare with.
BEFORE_FIRST_BALANCE = 9


@pytest.mark.parametrize("seed", [0, 7, 42])
def test_it_records_the_frames_a_plain_crafter_loop_renders(seed):
    steps = BEFORE_FIRST_BALANCE
    batch = record_batch(policy="scripted", seeds=(seed,), steps=steps)
    episode = batch.episodes.get()
    assert episode.status == Episode.Status.FINISHED
    store = FrameStore()
    stock = crafter.Env(area=(64, 64), size=(64, 64), length=steps, seed=seed)
    expected = [stock.reset()]
    for i in range(steps):
        expected.append(stock.step(ACTION_INDEX[DEFAULT_SCRIPT[i % 5]])[0])
    frames = list(episode.frames.order_by("step"))
    assert [f.step for f in frames] == list(range(steps + 1))
    for frame, pixels in zip(frames, expected, strict=True):
        png = store.read(frame.image.name)
        assert np.array_equal(decode_png(png), pixels), f"frame {frame.step}"
        assert (frame.width, frame.height) == (64, 64)


def test_it_links_each_turn_to_the_frame_it_saw():
    batch = record_batch(policy="random", seeds=(2,), steps=30)
    episode = batch.episodes.get()
    turns = list(episode.turns.select_related("frame").order_by("index"))
    assert len(turns) == episode.steps == 30
    assert [t.frame.step for t in turns] == list(range(30))
    assert all(len(t.actions) == 1 for t in turns)
    assert episode.frames.count() == 31
    assert sum(t.reward for t in turns) == pytest.approx(episode.total_reward)
    last = episode.frames.get(step=30)
    assert last.state["step"] == 30
    assert set(last.state["vitals"]) == {"health", "food", "drink", "energy"}


def test_it_records_achievements_and_the_step_they_were_unlocked():
    batch = record_batch(policy="scripted", seeds=(0,), steps=256)
    episode = batch.episodes.get()
    unlocked = {
        t.index: t.achievements_unlocked for t in episode.turns.all() if t.achievements_unlocked
    }
    assert episode.achievements, "the scripted walk collects something in 256 steps"
    for name, step in episode.achievements.items():
        # Baselines take one action per turn: the turn that unlocked it is step - 1.
        assert name in unlocked[step - 1]
    assert episode.achievement_count == len(episode.achievements)


def test_it_stores_identical_frames_once():
    first = record_batch(policy="scripted", seeds=(4,), steps=25)
    second = record_batch(policy="scripted", seeds=(4,), steps=25)
    hashes_first = list(
        first.episodes.get().frames.order_by("step").values_list("sha256", flat=True)
    )
    hashes_second = list(
        second.episodes.get().frames.order_by("step").values_list("sha256", flat=True)
    )
    assert hashes_first == hashes_second
    assert Frame.objects.count() == 52
    files = _all_files("frames")
    assert len(files) == len(set(hashes_first))
    assert Frame.objects.values("image").distinct().count() == len(set(hashes_first))


def _all_files(path: str) -> list[str]:
    dirs, files = default_storage.listdir(path)
    found = [f"{path}/{f}" for f in files]
    for d in dirs:
        found += _all_files(f"{path}/{d}")
    return found


def test_it_does_not_record_a_finished_episode_twice():
    batch = record_batch(policy="random", seeds=(3,), steps=20)
    episode = batch.episodes.get()
    before = list(Turn.objects.filter(episode=episode).values_list("id", flat=True))
    assert services.episode_run(episode_id=episode.id) == "done_already"
    assert list(Turn.objects.filter(episode=episode).values_list("id", flat=True)) == before
    batch.refresh_from_db()
    assert (batch.episodes_finished, batch.status) == (1, RolloutBatch.Status.FINISHED)


def test_it_lets_one_worker_claim_an_episode_at_a_time(settings):
    settings.STUDIO_EPISODE_STALE_SECONDS = 3600
    from rollouts.rollout_settings import RolloutSettings

    batch = services.batch_create(
        settings=RolloutSettings(policy="scripted", seeds=(1,), steps=5), enqueue=False
    )
    episode = batch.episodes.get()
    assert services.episode_claim(episode_id=episode.id) is not None
    assert services.episode_claim(episode_id=episode.id) is None
    assert services.episode_run(episode_id=episode.id) == "busy"


def test_it_keeps_the_turns_played_when_ending_the_episode_fails():
    from rollouts.policies import build_policy
    from rollouts.recording.recorder import EpisodeRecorder
    from rollouts.rollout_settings import RolloutSettings

    settings = RolloutSettings(policy="scripted", seeds=(3,), steps=4)
    batch = services.batch_create(settings=settings, enqueue=False)
    episode = batch.episodes.get()
    token = services.episode_claim(episode_id=episode.id)
    ended = []

    def end(totals) -> bool:
        ended.append(totals.steps)
        raise RuntimeError("the database went away")

    recorder = EpisodeRecorder(
        episode=Episode.objects.get(id=episode.id),
        settings=settings,
        policy=build_policy(settings, seed=3),
        claim_token=token,
        end=end,
    )
    with pytest.raises(RuntimeError, match="went away"):
        recorder.play()
    assert ended == [4]
    # The last rows went back with the failed end, and were saved without it.
    assert episode.turns.count() == 4
    frames = list(episode.frames.order_by("step"))
    assert [f.step for f in frames] == [0, 1, 2, 3, 4]
    assert all(default_storage.exists(f.image.name) for f in frames)
    assert Episode.objects.get(id=episode.id).status == Episode.Status.RUNNING


def test_it_replays_a_random_episode_identically():
    first = record_batch(policy="random", seeds=(11,), steps=50).episodes.get()
    second = record_batch(policy="random", seeds=(11,), steps=50).episodes.get()
    assert list(first.turns.values_list("actions", flat=True)) == list(
        second.turns.values_list("actions", flat=True)
    )
    assert list(first.frames.values_list("sha256", flat=True)) == list(
        second.frames.values_list("sha256", flat=True)
    )


def test_a_recorded_episode_leaves_no_world_for_the_cyclic_collector():
    def worlds() -> int:
        return sum(isinstance(o, crafter.engine.World) for o in gc.get_objects())

    gc.collect()
    before = worlds()
    gc.disable()
    try:
        record_batch(policy="random", seeds=(11, 12), steps=30)
        left = worlds() - before
    finally:
        gc.enable()
    assert left == 0
