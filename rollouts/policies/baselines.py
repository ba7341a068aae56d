"""The `scripted` and `random` baselines (SPEC section 3): one action per turn."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rollouts.game.crafter_env import ACTIONS
from rollouts.policies.base import Decision, Observation


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
