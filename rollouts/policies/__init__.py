"""Policies choose actions; the recorder plays them. `build_policy` is the one factory: it
asks the batch's kind (`rollouts.policies.kinds`)."""

from __future__ import annotations

from rollouts.policies.base import Decision, Observation, Policy, policy_seed
from rollouts.policies.kinds import build_policy, policy_kind

__all__ = ["Decision", "Observation", "Policy", "build_policy", "policy_kind", "policy_seed"]
