"""A GRPO `Player` for Django-free tests: Crafter played directly, nothing recorded.

Test scaffolding only: the product's player records every episode through the studio's
recorder. This one plays `StudioEnv` as the studio does (a seed's world, the text observation
and the frame each turn, the answer's actions read with the studio's own text reader, noop
when there are none), for up to `steps` turns an episode.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from PIL import Image

from rollouts.game.crafter_env import ACTION_INDEX, StudioEnv, text_observation
from rollouts.game.text_actions import actions_from_text
from training.open_models.grpo_play import EpisodeModel, IterationCanceled, PlayedEpisode


@dataclass
class CrafterPlayer:
    steps: int
    # Cancel asked before this iteration's second episode (None: never).
    cancel_in_iteration: int | None = None
    calls: list[tuple[int, int, tuple[tuple[int, int], ...]]] = field(default_factory=list)

    def play(
        self,
        *,
        iteration: int,
        checkpoint_step: int,
        episodes: Sequence[tuple[int, int]],
        model_for: Callable[[int, int], EpisodeModel],
    ) -> list[PlayedEpisode]:
        self.calls.append((iteration, checkpoint_step, tuple(episodes)))
        played = []
        for index, (seed, member) in enumerate(episodes):
            if index == 1 and iteration == self.cancel_in_iteration:
                raise IterationCanceled()
            played.append(self.episode(seed, member, model_for(seed, member)))
        return played

    def episode(self, seed: int, member: int, model: EpisodeModel) -> PlayedEpisode:
        env = StudioEnv(seed=seed)
        frame = env.reset()
        total, actions = 0.0, []
        for _ in range(self.steps):
            answer = model.reply(
                [
                    {"type": "image", "image": Image.fromarray(frame)},
                    {"type": "text", "text": text_observation(env)},
                ]
            )
            turn = actions_from_text(answer) or ["noop"]
            done = False
            for action in turn:
                frame, reward, done, _ = env.step(ACTION_INDEX[action])
                total += reward
                if done:
                    break
            actions.append(tuple(turn))
            if done:
                break
        unlocked = tuple(env.unlocked())
        env.close()
        return PlayedEpisode(
            seed=seed,
            member=member,
            episode_id=None,
            model=model,
            crafter_reward=total,
            achievements=unlocked,
            actions=tuple(actions),
        )
