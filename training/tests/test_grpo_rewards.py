"""The rewards a GRPO TOML can choose, checked against values worked out by hand."""

import math

import pytest

from training.open_models.rewards import RewardSpec, episode_reward, parse_reward


def test_default_is_crafters_own():
    assert parse_reward(None) == RewardSpec("crafter")
    assert episode_reward(
        parse_reward("crafter"), crafter_reward=2.1, achievements=["collect_wood"], actions=[]
    ) == pytest.approx(2.1)


def test_score_of_one_episode():
    # Two of the 22 achievements at 100%: exp((2 * ln 101) / 22) - 1, by hand.
    expected = math.exp(2 * math.log(101) / 22) - 1
    value = episode_reward(
        parse_reward("score"),
        crafter_reward=0.0,
        achievements=["collect_wood", "place_table", "collect_wood"],
        actions=[],
    )
    assert value == pytest.approx(expected)
    assert value == pytest.approx(0.5213, abs=1e-4)


def test_named_achievements_count_once_each():
    spec = parse_reward("achievements: collect_wood, place_table")
    assert spec.names == ("collect_wood", "place_table")
    got = episode_reward(
        spec, crafter_reward=5.0, achievements=["collect_wood", "wake_up"], actions=[]
    )
    assert got == 1.0


def test_action_share():
    spec = parse_reward("action:move_left")
    actions = [("move_left",), ("noop", "move_left"), (), ("do",)]
    assert episode_reward(spec, crafter_reward=0, achievements=[], actions=actions) == 0.5
    assert episode_reward(spec, crafter_reward=0, achievements=[], actions=[()]) == 0.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("crafter:x", "'crafter' takes no names"),
        ("coins", "'coins' is not a reward"),
        ("achievements:", "name at least one"),
        ("achievements:collect_gold", "'collect_gold' is not a Crafter achievement"),
        ("action:fly", "'fly' is not a Crafter action"),
        ("action:noop,do", "name exactly one action"),
        ("achievements:collect_wood,collect_wood", "a name is given twice"),
    ],
)
def test_refused_with_one_line(text, message):
    with pytest.raises(ValueError, match=message):
        parse_reward(text)
