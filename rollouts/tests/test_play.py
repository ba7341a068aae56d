"""Human play: key presses recorded as turns, state kept between them and rebuilt when lost."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from django.core.cache import cache

from rollouts.game.crafter_env import ACTION_INDEX, KEY_MAP, StudioEnv, encode_png
from rollouts.models import Episode, RolloutBatch
from rollouts.play import services as services_play

pytestmark = pytest.mark.django_db

# 30 key presses chosen by hand: walk, hit what is in front, sleep, place things.
KEYS = (
    ["move_right"] * 4
    + ["do"] * 5
    + ["move_down", "move_down", "do", "do", "noop", "move_left", "do"]
    + ["place_table", "make_wood_pickaxe", "sleep", "noop"]
    + ["move_up"] * 3
    + ["do", "move_left", "move_left", "do", "place_stone", "do", "noop"]
)
assert len(KEYS) == 30


def _start(editor, *, seed=3, steps=500, size=64) -> Episode:
    settings = services_play.play_settings(seed=seed, steps=steps, image_size=size)
    return services_play.play_start(settings=settings, user=editor)


def _inline_hashes(actions, *, seed=3, steps=500, size=64) -> list[str]:
    env = StudioEnv(seed=seed, size=size, length=steps)
    frames = [env.reset()]
    for action in actions:
        frames.append(env.step(ACTION_INDEX[action])[0])
    return [hashlib.sha256(encode_png(f).png).hexdigest() for f in frames]


def _recorded_hashes(episode: Episode) -> list[str]:
    return list(episode.frames.order_by("step").values_list("sha256", flat=True))


def test_it_records_each_key_as_a_turn_with_the_frames_of_an_inline_replay(editor):
    episode = _start(editor)
    assert episode.batch.policy == RolloutBatch.Policy.HUMAN
    assert episode.status == Episode.Status.RUNNING
    for turn, action in enumerate(KEYS):
        result = services_play.play_step(episode_id=episode.id, action=action, turn=turn)
        assert not result.duplicate
    assert _recorded_hashes(episode) == _inline_hashes(KEYS)
    turns = list(episode.turns.order_by("index").select_related("frame"))
    assert [t.actions for t in turns] == [[a] for a in KEYS]
    assert [t.frame.step for t in turns] == list(range(30))
    assert all(t.model_text is None and t.tool_calls == [] for t in turns)
    assert turns[0].observation_text.startswith("Step 0 of 500.")
    episode.refresh_from_db()
    assert episode.steps == 30


def test_it_rebuilds_a_lost_state_by_replay_and_plays_on_identically(editor):
    episode = _start(editor)
    for turn, action in enumerate(KEYS[:15]):
        services_play.play_step(episode_id=episode.id, action=action, turn=turn)
    cache.clear()  # the server's memory of the game is gone (flush, restart)
    for turn, action in enumerate(KEYS[15:], start=15):
        services_play.play_step(episode_id=episode.id, action=action, turn=turn)
        if turn == 22:
            cache.clear()
    assert _recorded_hashes(episode) == _inline_hashes(KEYS)


def test_a_snapshot_left_behind_by_another_process_is_not_used(editor):
    episode = _start(editor)
    services_play.play_step(episode_id=episode.id, action="move_right", turn=0)
    stale = cache.get(f"studio:play:{episode.id}:1")
    services_play.play_step(episode_id=episode.id, action="move_right", turn=1)
    # Another process still holds the game after turn 0 and saves it back under its key:
    # the key names the turn count, so turn 2 never reads it.
    cache.set(f"studio:play:{episode.id}:1", stale)
    services_play.play_step(episode_id=episode.id, action="do", turn=2)
    assert _recorded_hashes(episode) == _inline_hashes(["move_right", "move_right", "do"])


def test_a_double_sent_key_records_one_turn(editor):
    episode = _start(editor)
    first = services_play.play_step(episode_id=episode.id, action="move_left", turn=0)
    again = services_play.play_step(episode_id=episode.id, action="move_left", turn=0)
    assert not first.duplicate and again.duplicate
    assert again.turns == 1
    assert episode.turns.count() == 1
    assert episode.frames.count() == 2


def test_a_game_whose_stored_frame_was_tampered_with_cannot_be_rebuilt(editor):
    episode = _start(editor)
    for turn, action in enumerate(KEYS[:5]):
        services_play.play_step(episode_id=episode.id, action=action, turn=turn)
    episode.frames.filter(step=5).update(sha256="0" * 64)
    cache.clear()
    with pytest.raises(services_play.PlayError, match="sha256"):
        services_play.play_step(episode_id=episode.id, action="do", turn=5)
    assert episode.turns.count() == 5


def test_the_game_ends_at_its_step_limit_as_a_finished_episode(editor):
    episode = _start(editor, steps=3)
    for turn in range(3):
        services_play.play_step(episode_id=episode.id, action="noop", turn=turn)
    episode.refresh_from_db()
    assert episode.status == Episode.Status.FINISHED
    assert episode.batch.status == RolloutBatch.Status.FINISHED
    with pytest.raises(services_play.PlayError, match="has ended"):
        services_play.play_step(episode_id=episode.id, action="noop", turn=3)


def test_an_unknown_action_is_refused(editor):
    episode = _start(editor)
    with pytest.raises(services_play.PlayError, match="not one of"):
        services_play.play_step(episode_id=episode.id, action="fly", turn=0)
    assert episode.turns.count() == 0


def test_the_key_map_is_crafters_own():
    # crafter's run_gui.py, read as text: `pygame.K_w: 'move_up'`, ...
    import re

    import crafter

    gui = Path(crafter.__file__).with_name("run_gui.py").read_text()
    theirs = {k.lower(): a for k, a in re.findall(r"pygame\.K_(\w+): '(\w+)'", gui)}
    ours = {("space" if k == " " else k.lower()): a for k, a in KEY_MAP if a != "noop"}
    assert ours == theirs
    assert dict(KEY_MAP)["n"] == "noop"


def test_a_snapshot_plays_on_like_the_game_it_was_taken_from():
    import pickle

    env = StudioEnv(seed=5, size=64, length=2000)
    env.reset()
    rng = np.random.default_rng(1)
    for _ in range(300):
        env.step(int(rng.integers(17)))
    copy = pickle.loads(pickle.dumps(env))
    for _ in range(200):
        action = int(rng.integers(17))
        assert np.array_equal(env.step(action)[0], copy.step(action)[0])


@pytest.mark.django_db(transaction=True)
def test_the_same_key_sent_at_once_from_many_places_records_one_turn(editor):
    import threading

    from django.db import connections

    episode = _start(editor)
    services_play.play_step(episode_id=episode.id, action="noop", turn=0)
    barrier = threading.Barrier(6)
    outcomes: list[object] = []

    def press() -> None:
        try:
            barrier.wait()
            result = services_play.play_step(episode_id=episode.id, action="do", turn=1)
            outcomes.append(result.duplicate)
        except Exception as exc:  # recorded: the assertion below names it
            outcomes.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=press) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes, key=str) == [False] + [True] * 5, outcomes
    assert episode.turns.count() == 2 and episode.frames.count() == 3
