"""The reward a GRPO run gives an episode, as its TOML chooses (`[training.grpo] reward`).

Django-free. Four kinds, each one line of TOML:

- `"crafter"` (the default): crafter's own reward, summed over the episode (+1 for each
  achievement's first unlock, +-0.1 for each point of health gained or lost);
- `"score"`: the Crafter score of the episode alone (its success rates are 0 or 100), in
  percent as everywhere in the studio;
- `"achievements:collect_wood,place_table"`: how many of the named achievements the episode
  unlocked;
- `"action:move_left"`: the share of the episode's executed actions that were the named one.
  Trivially learnable, it checks that a set-up learns at all before a real reward is tried.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rollouts.game.crafter_env import ACHIEVEMENTS, ACTIONS
from rollouts.game.scoring import crafter_score, success_rates

DEFAULT_REWARD = "crafter"
_KINDS = ("crafter", "score", "achievements", "action")


@dataclass(frozen=True)
class RewardSpec:
    kind: str  # one of _KINDS
    names: tuple[str, ...] = ()  # the achievements, or the one action

    @property
    def text(self) -> str:
        return f"{self.kind}:{','.join(self.names)}" if self.names else self.kind


def parse_reward(text: str | None) -> RewardSpec:
    """The reward a TOML names; ValueError with one line saying what is wrong."""
    if text is None:
        text = DEFAULT_REWARD
    kind, colon, rest = str(text).strip().partition(":")
    kind = kind.strip()
    if kind in ("crafter", "score"):
        if colon:
            raise ValueError(f"{kind!r} takes no names (write reward = {kind!r})")
        return RewardSpec(kind)
    if kind not in _KINDS:
        raise ValueError(
            f"{kind[:60]!r} is not a reward; write 'crafter', 'score', "
            "'achievements:NAME,NAME' or 'action:NAME'"
        )
    names = tuple(part.strip() for part in rest.split(",") if part.strip())
    if not names:
        raise ValueError(f"{kind}: name at least one, e.g. {kind}:{_example(kind)}")
    known = ACHIEVEMENTS if kind == "achievements" else ACTIONS
    unknown = [name for name in names if name not in known]
    if unknown:
        what = "achievement" if kind == "achievements" else "action"
        raise ValueError(f"{unknown[0][:60]!r} is not a Crafter {what}")
    if len(set(names)) != len(names):
        raise ValueError(f"{kind}: a name is given twice")
    if kind == "action" and len(names) != 1:
        raise ValueError("action: name exactly one action")
    return RewardSpec(kind, names)


def _example(kind: str) -> str:
    return "collect_wood,place_table" if kind == "achievements" else "move_left"


def episode_reward(
    spec: RewardSpec,
    *,
    crafter_reward: float,
    achievements: Iterable[str],
    actions: Iterable[Iterable[str]],
) -> float:
    """The episode's reward under `spec`, from what was recorded of it."""
    if spec.kind == "crafter":
        return float(crafter_reward)
    unlocked = set(achievements)
    if spec.kind == "score":
        return crafter_score(success_rates([unlocked]))
    if spec.kind == "achievements":
        return float(sum(1 for name in spec.names if name in unlocked))
    executed = [action for turn in actions for action in turn]
    if not executed:
        return 0.0
    return sum(1 for action in executed if action == spec.names[0]) / len(executed)
