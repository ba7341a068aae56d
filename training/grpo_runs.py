"""A GRPO job's iterations on its train worker: the studio's side of `run_grpo`.

`StudioPlayer` plays an iteration's episodes with the model being trained, each recorded as
any episode is (a `RolloutBatch` of the `grpo` kind per iteration, its frames and turns,
its `GrpoIteration`), and reads back what the reward needs from the recorded rows.
`GrpoRunSink` writes what the trainer reports: each episode's reward and its turns'
advantage, the iteration's statistics, its loss as the job's loss curve; and, when a run
resumes from a checkpoint, removes the iterations after it, which are played again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from django.db import transaction
from django.utils import timezone

from rollouts.game.scoring import crafter_score, success_rates
from rollouts.game.tools import PROMPT_VERSION
from rollouts.models import Episode, Frame, RolloutBatch, Turn
from rollouts.recording.services import batch_cancel, batch_create, episode_run
from rollouts.rollout_settings import RolloutSettings
from training.grpo_policy import OBSERVATION_MODE, TrainedPolicy, first_messages
from training.grpo_statistics import mean_interval
from training.models import GrpoIteration, LocalRun
from training.open_models.grpo_play import (
    EpisodeModel,
    IterationCanceled,
    PlayedEpisode,
    ScoredEpisode,
)
from training.providers.base import clean_number
from training.run_sink import RunSink

logger = logging.getLogger(__name__)

# `RolloutSettings.model` holds this much of the job's model name (a path may be longer).
MODEL_NAME_CHARS = 200
GRPO_POLICY = "grpo"


class EpisodeNotPlayed(RuntimeError):
    """An episode of an iteration did not finish (its error is on its row): the run fails."""


def iteration_settings(
    *, job_id: int, iteration: int, model: str, seeds: Sequence[int], group_size: int, steps: int
) -> RolloutSettings:
    """An iteration's batch settings, as valid as any batch's: the pages read them."""
    return RolloutSettings(
        policy=GRPO_POLICY,
        seeds=tuple(seeds),
        samples_per_seed=group_size,
        steps=steps,
        observation_mode=OBSERVATION_MODE,
        history_frames=0,
        model=model[-MODEL_NAME_CHARS:],
        name=f"GRPO job {job_id}, iteration {iteration}",
    )


class StudioPlayer:
    """Plays a GRPO job's iterations on this worker (`training.open_models.grpo_play.Player`)."""

    def __init__(self, *, run: LocalRun, sink: GrpoRunSink, steps: int, reward: str) -> None:
        self.run = run
        self.job = run.job
        self.sink = sink
        self.steps = steps
        self.reward = str(reward)[:500]

    def play(
        self,
        *,
        iteration: int,
        checkpoint_step: int,
        episodes: Sequence[tuple[int, int]],
        model_for: Callable[[int, int], EpisodeModel],
    ) -> list[PlayedEpisode]:
        pairs = [(int(seed), int(member)) for seed, member in episodes]
        seeds = list(dict.fromkeys(seed for seed, _ in pairs))
        group_size = len(pairs) // max(len(seeds), 1)
        if sorted(pairs) != sorted((s, m) for s in seeds for m in range(group_size)):
            raise ValueError(f"iteration {iteration}: episodes are not {group_size} of each seed")
        self._check_stop(None, iteration)
        row = self._iteration_create(iteration, checkpoint_step, seeds, group_size)
        ids = dict(
            ((seed, sample), pk)
            for seed, sample, pk in Episode.objects.filter(batch_id=row.batch_id).values_list(
                "seed", "sample", "id"
            )
        )
        played = []
        for seed, member in pairs:
            self._check_stop(row, iteration)
            model = model_for(seed, member)
            episode_id = ids[(seed, member)]
            outcome = episode_run(episode_id=episode_id, policy=TrainedPolicy(model))
            if outcome == "canceled":  # its batch was canceled from the batch's page
                self._canceled(row)
                raise IterationCanceled(f"iteration {iteration}: its batch was canceled")
            if outcome != "finished":
                error = Episode.objects.filter(id=episode_id).values_list("error", flat=True)
                raise EpisodeNotPlayed(
                    f"iteration {iteration}: episode {episode_id} (seed {seed}, member "
                    f"{member}) {outcome}: {(error.first() or '')[:500]}"
                )
            played.append(_played(episode_id, seed=seed, member=member, model=model))
        return played

    def _check_stop(self, row: GrpoIteration | None, iteration: int) -> None:
        """Cancel (or a lost claim) stops the run between two episodes."""
        if self.sink.should_stop():
            if row is not None:
                self._canceled(row)
            raise IterationCanceled(f"iteration {iteration}: Cancel was asked")

    def _iteration_create(
        self, iteration: int, checkpoint_step: int, seeds: list[int], group_size: int
    ) -> GrpoIteration:
        # What a worker that died left of this iteration and after (its update was lost).
        iterations_remove(job_id=self.job.id, above=iteration - 1)
        settings = iteration_settings(
            job_id=self.job.id,
            iteration=iteration,
            model=self.job.model,
            seeds=seeds,
            group_size=group_size,
            steps=self.steps,
        )
        with transaction.atomic():
            batch = batch_create(settings=settings, enqueue=False)
            # The kind sends no paid prompt, but the model reads the studio's system prompt:
            # the batch records it, as a model batch does.
            RolloutBatch.objects.filter(id=batch.id).update(
                prompt_version=PROMPT_VERSION, system_prompt=first_messages()[0]["content"]
            )
            return GrpoIteration.objects.create(
                job_id=self.job.id,
                number=iteration,
                batch=batch,
                checkpoint_step=checkpoint_step,
                seeds=seeds,
                group_size=group_size,
                reward=self.reward,
            )

    def _canceled(self, row: GrpoIteration) -> None:
        GrpoIteration.objects.filter(id=row.id).update(status=GrpoIteration.Status.CANCELED)
        batch = RolloutBatch.objects.filter(id=row.batch_id).first()
        if batch is not None:
            batch_cancel(batch=batch)


def _played(episode_id: int, *, seed: int, member: int, model: EpisodeModel) -> PlayedEpisode:
    """What the reward needs of an episode, as its rows recorded it."""
    episode = Episode.objects.values("total_reward", "achievements").get(id=episode_id)
    actions = Turn.objects.filter(episode_id=episode_id).order_by("index")
    achievements = episode["achievements"] if isinstance(episode["achievements"], dict) else {}
    return PlayedEpisode(
        seed=seed,
        member=member,
        episode_id=episode_id,
        model=model,
        crafter_reward=float(episode["total_reward"]),
        achievements=tuple(achievements),
        actions=tuple(tuple(a) for a in actions.values_list("actions", flat=True)),
    )


def iterations_remove(*, job_id: int, above: int) -> list[int]:
    """Delete the job's iterations numbered above `above`, with their batches (episodes,
    turns, frame rows; the frame files are shared by content, and stay). Their numbers."""
    rows = list(
        GrpoIteration.objects.filter(job_id=job_id, number__gt=above).values_list(
            "id", "number", "batch_id"
        )
    )
    if not rows:
        return []
    batches = [batch_id for _, _, batch_id in rows]
    with transaction.atomic():
        GrpoIteration.objects.filter(id__in=[pk for pk, _, _ in rows]).delete()
        # Turns first: a turn protects its frame.
        Turn.objects.filter(episode__batch_id__in=batches).delete()
        Frame.objects.filter(episode__batch_id__in=batches).delete()
        Episode.objects.filter(batch_id__in=batches).delete()
        RolloutBatch.objects.filter(id__in=batches).delete()
    return sorted(number for _, number, _ in rows)


class GrpoRunSink(RunSink):
    """What a GRPO run reports (`training.open_models.grpo_play.GrpoSink`), written as the
    job's rows: the run's events and loss points as `RunSink` writes them, the rest on its
    iterations and their episodes."""

    def resuming(self, step: int) -> None:
        removed = iterations_remove(job_id=self.job_id, above=int(step))
        if removed:
            self.event(
                "iterations_removed",
                f"Resumed from step {step}: iteration{'s' if len(removed) > 1 else ''} "
                f"{', '.join(map(str, removed))} removed, to be played again",
                data={"step": int(step), "removed": removed},
            )

    def iteration_scored(self, iteration: int, scored: list[ScoredEpisode]) -> None:
        rewards = []
        achievements = []
        with transaction.atomic():
            for item in scored:
                episode_id = item.episode.episode_id
                reward, advantage = clean_number(item.reward), clean_number(item.advantage)
                if reward is not None:
                    rewards.append(reward)
                achievements.append(item.episode.achievements)
                if episode_id is None:
                    continue
                Episode.objects.filter(id=episode_id).update(rl_reward=reward)
                Turn.objects.filter(episode_id=episode_id).update(advantage=advantage)
            mean, low, high = mean_interval(rewards)
            rates = success_rates(achievements)
            GrpoIteration.objects.filter(job_id=self.job_id, number=iteration).update(
                status=GrpoIteration.Status.COMPLETE,
                episodes=len(scored),
                reward_mean=mean,
                reward_low=low,
                reward_high=high,
                score=crafter_score(rates) if scored else None,
                success_rates=rates if scored else {},
                completed_at=timezone.now(),
            )
        self.event(
            "iteration_scored",
            f"Iteration {iteration}: {len(scored)} episodes, mean reward "
            + (f"{mean:.4g}" if mean is not None else "-"),
            data={"step": iteration, "reward_mean": mean},
        )

    def iteration_logged(self, iteration: int, *, loss: float | None, kl: float | None) -> None:
        GrpoIteration.objects.filter(job_id=self.job_id, number=iteration).update(
            loss=clean_number(loss), kl=clean_number(kl)
        )
        # The job's loss chart draws the train points: a GRPO run's loss is one an iteration.
        self.metrics(iteration, train_loss=loss)
