"""Policies choose actions; the recorder plays them. `build_policy` is the one factory."""

from __future__ import annotations

from rollouts.policies.base import Decision, Observation, Policy, policy_seed
from rollouts.rollout_settings import RolloutSettings


def build_policy(
    settings: RolloutSettings, *, seed: int, sample: int = 0, cli_api_key: str = ""
) -> Policy:
    """`cli_api_key`: the key of a command playing inline, for a URL its operator typed."""
    if settings.policy == "scripted":
        from rollouts.policies.baselines import ScriptedPolicy

        return ScriptedPolicy(settings.actions)
    if settings.policy == "random":
        from rollouts.policies.baselines import RandomPolicy

        return RandomPolicy(seed=policy_seed(seed=seed, sample=sample))
    if settings.policy == "openai":
        from rollouts.policies.openai import OpenAIPolicy

        return OpenAIPolicy(settings, seed=seed, sample=sample, cli_api_key=cli_api_key)
    raise ValueError(f"unknown policy {settings.policy!r}")


__all__ = ["Decision", "Observation", "Policy", "build_policy", "policy_seed"]
