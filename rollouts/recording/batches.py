"""A batch's life: create it with one pending episode per seed and sample, send its episodes
(`EPISODES`, a `studio.job_groups.JobGroup`), play them here instead (`--inline`), resume and
cancel it. Each episode's own life is `episodes`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from django.db import transaction
from django.db.models import F, Sum
from django.utils import timezone
from redis.exceptions import RedisError

from rollouts.game.crafter_env import library_versions
from rollouts.game.tools import PROMPT_VERSION, system_prompt
from rollouts.jobs import EPISODE
from rollouts.models import Episode, RolloutBatch
from rollouts.policies import policy_kind
from rollouts.recording import sent_calls
from rollouts.recording.episodes import (
    RESUME_REQUESTED,
    SENT_FIELDS,
    batch_credit,
    batch_settings,
    episode_run,
)
from rollouts.recording.recorder import (
    EPISODE_COUNTERS,
    batch_counters_of,
)
from rollouts.rollout_settings import RolloutSettings
from studio.job_groups import JobGroup, run_inline
from studio.row_copy import copy_rows

logger = logging.getLogger(__name__)

# An episode in one of these is over: nothing sends it to a worker again (but a resume).
EPISODE_ENDED = (Episode.Status.FINISHED, Episode.Status.FAILED, Episode.Status.CANCELED)

# A progress bar for a batch played inline: (batch, episodes to play) -> a tqdm-like bar.
Progress = Callable[[RolloutBatch, int], contextlib.AbstractContextManager[Any]]


# A batch's episodes, as a group (`studio.job_groups`): sent, resumed and canceled together.
EPISODES = JobGroup(
    parent=RolloutBatch,
    children=EPISODE,
    link="batch",
    done=Episode.Status.FINISHED,
    stopped=(Episode.Status.FAILED, Episode.Status.CANCELED),
    parent_canceled=RolloutBatch.Status.CANCELED,
    child_canceled=Episode.Status.CANCELED,
)


def batch_create(
    *, settings: RolloutSettings, created_by=None, enqueue: bool = True
) -> RolloutBatch:
    """One batch, one pending episode per seed; enqueued on Celery once committed."""
    versions = library_versions()
    sends_prompt = policy_kind(settings.policy).calls_model
    with transaction.atomic():
        batch = RolloutBatch.objects.create(
            name=settings.name,
            policy=settings.policy,
            model=settings.model,
            endpoint=settings.base_url,
            endpoint_name=settings.endpoint,
            seeds=list(settings.seeds),
            step_limit=settings.steps,
            image_size=settings.image_size,
            settings=settings.to_json(),
            prompt_version=PROMPT_VERSION if sends_prompt else 0,
            system_prompt=(
                system_prompt(
                    observation_mode=settings.observation_mode,
                    history_frames=settings.history_frames,
                )
                if sends_prompt
                else ""
            ),
            episodes_total=len(settings.seeds) * settings.samples_per_seed,
            created_by=created_by,
            crafter_version=versions["crafter"],
            numpy_version=versions["numpy"],
            opensimplex_version=versions["opensimplex"],
        )
        # Without enqueue the caller plays them (`--inline`): stamped as handed over, so the
        # periodic requeue never sends them to workers behind its back.
        handed = None if enqueue else timezone.now()
        episodes = [
            Episode(batch=batch, seed=seed, sample=sample, enqueued_at=handed)
            for seed in settings.seeds
            for sample in range(settings.samples_per_seed)
        ]
        # COPY on PostgreSQL, cheaper than bulk_create: the rows are written before the
        # first of their messages can leave.
        copy_rows(episodes)
        ids = [episode.id for episode in episodes]
        if enqueue and all(ids) and batch.policy != RolloutBatch.Policy.HUMAN:
            # New episodes, never sent: no need to look them up and clear their stamps first
            # (two statements and a commit before the first message, on every episode's path).
            EPISODES.send_on_commit(ids)
        elif enqueue:  # a database that does not return the new ids
            transaction.on_commit(lambda: batch_enqueue(batch=batch))
    return batch


def batch_run_inline(
    *,
    settings: RolloutSettings,
    created_by=None,
    cli_api_key: str = "",
    progress: Progress | None = None,
    workers: int | None = None,
) -> RolloutBatch:
    """Create a batch and play it here, no broker or worker: `rollout --inline`, the demo's
    batch, tests and benchmarks. Returns the batch as it ended (see `batch_play_inline`)."""
    batch = batch_create(settings=settings, created_by=created_by, enqueue=False)
    return batch_play_inline(
        batch=batch, cli_api_key=cli_api_key, progress=progress, workers=workers
    )


def batch_play_inline(
    *,
    batch: RolloutBatch,
    cli_api_key: str = "",
    progress: Progress | None = None,
    workers: int | None = None,
) -> RolloutBatch:
    """Play the batch's unfinished episodes in this process, by seed and sample; a failed
    episode is recorded as failed (its batch says so), never raised.

    Model calls wait on the network, so an `openai` batch overlaps up to its `concurrency`
    episodes, each in a thread of its own (with its own database connection); baselines are
    CPU-bound and play one by one in the calling thread; so does everything inside an open
    transaction. `workers` overrides that choice.
    `cli_api_key`: see `episode_run`. `progress(batch, total)` gives a bar (tqdm's
    interface: a context manager with `update(n)`), advanced once per episode.
    """
    ids = list(
        batch.episodes.exclude(status__in=EPISODE_ENDED)
        .order_by("seed", "sample")
        .values_list("id", flat=True)
    )
    if workers is None:
        settings = batch_settings(batch)
        workers = settings.concurrency if policy_kind(settings.policy).calls_model else 1
    bar = progress(batch, len(ids)) if progress is not None else _NoProgress()
    with bar:
        run_inline(
            ids,
            lambda episode_id: episode_run(episode_id=episode_id, cli_api_key=cli_api_key),
            workers=workers,
            advanced=lambda: bar.update(1),
        )
    batch.refresh_from_db()
    return batch


class _NoProgress(contextlib.nullcontext):
    def update(self, n: int = 1) -> None:
        pass


def batch_enqueue(*, batch: RolloutBatch) -> int:
    """Send one task per unfinished episode. Safe to repeat: tasks claim before they play.

    Returns how many were sent; fewer than asked when the broker is down, and those left
    are sent by the periodic requeue once it is back (their `enqueued_at` stays empty).
    """
    if batch.policy == RolloutBatch.Policy.HUMAN:
        return 0  # a person plays these, in the browser
    ids = list(
        batch.episodes.exclude(status__in=EPISODE_ENDED)
        .order_by("seed", "sample")
        .values_list("id", flat=True)
    )
    return EPISODES.send_again(ids)


def batch_resume(*, batch: RolloutBatch, enqueue: bool = True) -> int:
    """Run again what did not finish: failed or canceled episodes go on from their last
    recorded turn (a model's; a baseline's start afresh), pending ones and running ones whose
    worker died (stale heartbeat) are sent again. `rollout --resume` and the batch page's
    Resume. Returns how many episodes are left to play."""
    if batch.policy == RolloutBatch.Policy.HUMAN:
        return 0  # a person's game is played on in the browser, or forked
    # Replayed from their recorded turns when played again (episode_run, attempts > 1).
    left = EPISODES.resume(
        batch.id,
        enqueue=enqueue,
        child_fields={"resume_note": RESUME_REQUESTED},
        parent_fields=lambda reset: {"episodes_failed": F("episodes_failed") - reset},
    )
    batch.refresh_from_db()
    return left


def batch_cancel(*, batch: RolloutBatch) -> int:
    """Stop a pending or running batch: its unfinished episodes end as canceled. A worker
    playing one keeps its claim, writes what it played, stops before its next model call
    (`EpisodeRecorder`) and lets go (`_episode_canceled`). Returns episodes stopped."""
    stopped = EPISODES.cancel(
        batch.id,
        before=_batch_credit_dead_episodes,
        parent_fields=lambda stopped: {"episodes_failed": F("episodes_failed") + stopped},
    )
    batch.refresh_from_db()
    return stopped


def _batch_credit_dead_episodes(batch: RolloutBatch) -> None:
    """Under the canceled batch's lock: an episode whose worker is gone (a stale claim) will
    not let go by itself, so its calls, counted on its row with each turn, are counted on
    the batch here."""
    dead = Episode.objects.filter(
        batch=batch,
        status=Episode.Status.RUNNING,
        heartbeat_at__lt=timezone.now() - EPISODE.stale_after(),
    )
    unheld = dead.aggregate(**{name: Sum(name) for name in EPISODE_COUNTERS})
    # ... and the requests they sent that no written turn counts (Redis gone: a cancel
    # still goes through, with the rows' counts).
    with contextlib.suppress(RedisError):
        for row in dead.values("id", *SENT_FIELDS):
            for name, value in sent_calls.unsettled_calls(
                sent_calls.episode_key(row["id"], batch_created_at=batch.created_at),
                counted=row,
            ).items():
                unheld[name] = (unheld[name] or 0) + value
    dead.update(claim_token="")
    if unheld["model_calls"]:
        batch_credit(batch_id=batch.id, credit=batch_counters_of(unheld))


def batch_episodes_still_playing(*, batch: RolloutBatch) -> int:
    """Canceled episodes whose worker, alive (a fresh heartbeat), has not let go yet."""
    fresh = timezone.now() - EPISODE.stale_after()
    return (
        Episode.objects.filter(batch=batch, status=Episode.Status.CANCELED, heartbeat_at__gte=fresh)
        .exclude(claim_token="")
        .count()
    )
