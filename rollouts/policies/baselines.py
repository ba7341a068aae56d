"""The `scripted` and `random` baselines: one action per turn (docs/recording.md)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rollouts.game.crafter_env import ACTIONS
from rollouts.policies.base import Decision, Observation, policy_seed
from rollouts.policies.kinds import PolicyKind, register


class ScriptedPolicy:
    """Cycles a list of action names, synth-ai's by default."""

    def __init__(self, actions: Sequence[str]) -> None:
        self.actions = tuple(actions)

    def decide(self, observation: Observation) -> Decision:
        return Decision(actions=[self.actions[observation.turn % len(self.actions)]])

    def close(self) -> None:
        pass


class RandomPolicy:
    """Uniform over the 17 actions, seeded from the episode seed and sample
    (`policy_seed`): a rerun plays the same game."""

    def __init__(self, *, seed: int) -> None:
        self.random = np.random.default_rng(seed)

    def decide(self, observation: Observation) -> Decision:
        return Decision(actions=[ACTIONS[int(self.random.integers(len(ACTIONS)))]])

    def close(self) -> None:
        pass


def _scripted(settings, *, seed: int, sample: int = 0, cli_api_key: str = "") -> ScriptedPolicy:
    return ScriptedPolicy(settings.actions)


def _random(settings, *, seed: int, sample: int = 0, cli_api_key: str = "") -> RandomPolicy:
    return RandomPolicy(seed=policy_seed(seed=seed, sample=sample))


SCRIPTED = register(
    PolicyKind(
        name="scripted",
        factory=_scripted,
        help="scripted cycles --actions",
        page_help="scripted cycles a list of actions",
        options=("actions",),
    )
)
RANDOM = register(PolicyKind(name="random", factory=_random, help="random picks uniformly"))
