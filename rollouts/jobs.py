"""The background jobs of rollouts, each declared once (`studio.jobs`): an episode played by a
worker, and a bulk flag applied in chunks."""

from __future__ import annotations

from django.db.models import QuerySet
from django.utils import timezone

from rollouts.models import Episode, RolloutBatch, TurnBulkFlag
from rollouts.policies.kinds import model_policy_names, policy_kinds
from studio.jobs import JobKind, register


def _played_by_workers() -> QuerySet:
    # A person's game waits for its player, however long: no worker can play it. Nor can one
    # play a kind without a factory (a GRPO job's episodes: only its train worker holds the
    # model), so the requeue never sends them to the rollouts queue.
    unplayed = [kind.name for kind in policy_kinds() if not kind.played_by_worker]
    return Episode.objects.exclude(batch__policy__in=unplayed)


def _calling_a_model() -> QuerySet:
    # A model-calling kind's turns are model calls (`PolicyKind.calls_model`): its episodes
    # wait on the network, the baselines' on the cores.
    return Episode.objects.filter(batch__policy__in=model_policy_names())


def _waiting_to_be_played() -> QuerySet:
    # A failed batch stopped: its pending episodes are not sent again.
    return _played_by_workers().exclude(batch__status=RolloutBatch.Status.FAILED)


# Claimed through `JobKind.claim_returning` (one statement that also reads the
# episode and its batch, on every episode's path: `rollouts.recording.services`); this kind
# sends, re-sends and dates staleness like every other.
EPISODE = register(
    JobKind(
        name="episode",
        model=Episode,
        task="rollouts.tasks.episode_run",
        stale_setting="STUDIO_EPISODE_STALE_SECONDS",
        finished=Episode.Status.FINISHED,
        rows=_played_by_workers,
        waiting_rows=_waiting_to_be_played,
        created_field="batch__created_at",
        calls_model=_calling_a_model,
        hours=6,
        # A worker that takes over its predecessor's episodes dates when it was found gone
        # (the batch page says so).
        taken_over=lambda: {"lost_worker_at": timezone.now()},
    )
)

BULK_FLAG = register(
    JobKind(
        name="bulk_flag",
        model=TurnBulkFlag,
        task="rollouts.tasks.turn_bulk_flag_run",
        stale_setting="STUDIO_BULK_FLAG_STALE_SECONDS",
        hours=3,
    )
)
