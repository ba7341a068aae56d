"""Reads for evaluation: batches side by side on shared seeds, the leaderboard, held-out seeds.

Every read here costs a fixed number of queries whatever the number of episodes: episodes
are fetched once as plain values and the statistics run in `evaluation.statistics`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count, Exists, Max, OuterRef, Q

from curation.models import DatasetVersion
from evaluation.baselines import batches_covering_seeds
from evaluation.statistics import (
    EpisodeOutcome,
    Moments,
    OutcomeGroup,
    PairedComparison,
    Summary,
    held_out_seeds,
    outcome_groups,
    paired_comparison,
    summarize,
    summarize_groups,
)
from rollouts.models import Episode, Frame, RolloutBatch, Turn
from rollouts.policies.kinds import policy_kind_or_none
from rollouts.review.turn_selection import TurnSelection, turns_selected
from rollouts.rollout_settings import MAX_SEED  # the largest seed a batch accepts
from studio.cached import cached

MAX_COMPARED_BATCHES = 8
REFERENCE_FILE = Path(__file__).resolve().parent / "crafter_reference_scores.json"
# The paper's agents, in its table's order, with the names it gives them.
REFERENCE_LABELS = {
    "human_experts": "Human experts",
    "dreamerv2": "DreamerV2",
    "ppo": "PPO",
    "rainbow": "Rainbow",
    "random": "Random",
}


# Statistics of batches are cached (for `settings.STUDIO_STATISTICS_CACHE_SECONDS`, a week by
# default), keyed by what they are computed from (see `_cached_statistics`): a leaderboard of
# 40,000 episodes takes seconds to read and bootstrap. With Redis the cache is shared by every
# process, and `evaluation.tasks.statistics_warm` fills the leaderboard's when a batch finishes.


def _episodes_signature(batch_ids: Sequence[int]) -> list[tuple[int, str, int, int]]:
    """What the batches' statistics depend on, read in one query: per batch and status, how
    many episodes and the newest id. An episode added, removed or finishing changes it; a
    finished episode's outcome is not edited in place."""
    return list(
        Episode.objects.filter(batch_id__in=batch_ids)
        .order_by()
        .values_list("batch_id", "status")
        .annotate(n=Count("id"), last=Max("id"))
        .order_by("batch_id", "status")
    )


def _cached_statistics(kind: str, inputs: Any, batch_ids: Sequence[int], compute: Callable):
    """`compute()`, or its earlier result for the same `inputs` and the same episodes."""
    key_data = json.dumps(
        [kind, inputs, _episodes_signature(batch_ids)], sort_keys=True, default=str
    )
    key = f"evaluation:{kind}:{hashlib.sha256(key_data.encode()).hexdigest()}"
    return cached(key, compute, seconds=settings.STUDIO_STATISTICS_CACHE_SECONDS)


class ComparisonError(ValueError):
    """The batches cannot be compared; the message says why, in one line."""


@dataclass(frozen=True)
class BatchColumn:
    batch: RolloutBatch
    summary: Summary  # over the shared seeds only
    left_out_seeds: list[int]  # seeds of this batch that another batch did not play


@dataclass(frozen=True)
class Difference:
    batch: RolloutBatch
    against: RolloutBatch
    paired: PairedComparison


@dataclass(frozen=True)
class BatchComparison:
    shared_seeds: list[int]
    columns: list[BatchColumn]
    differences: list[Difference]
    # (batch id, seed) -> episode ids on that seed, first sample first
    episode_ids: dict[tuple[int, int], list[int]] = field(default_factory=dict)

    @property
    def batches(self) -> list[RolloutBatch]:
        return [column.batch for column in self.columns]


def parse_batch_ids(values: Iterable[str]) -> list[int]:
    """`3,5,8` (or several values) -> [3, 5, 8], in the order given."""
    ids: list[int] = []
    for value in values:
        for part in str(value).split(","):
            part = part.strip()
            if not part:
                continue
            if not part.isdigit() or len(part) > 12:
                raise ComparisonError(f"batches: {part[:40]!r} is not a batch id")
            if int(part) not in ids:
                ids.append(int(part))
    return ids


def _outcome(row: dict[str, Any]) -> EpisodeOutcome:
    achievements = row["achievements"] if isinstance(row["achievements"], dict) else {}
    return EpisodeOutcome(
        seed=row["seed"],
        status=row["status"],
        achievements=frozenset(achievements),
        reward=row["total_reward"],
        steps=row["steps"],
        episode_id=row["id"],
    )


def _outcomes_by_batch(batch_ids: Sequence[int]) -> dict[int, list[EpisodeOutcome]]:
    by_batch: dict[int, list[EpisodeOutcome]] = defaultdict(list)
    rows = (
        Episode.objects.filter(batch_id__in=batch_ids)
        .order_by("batch_id", "seed", "id")
        .values("id", "batch_id", "seed", "status", "achievements", "total_reward", "steps")
    )
    for row in rows:
        by_batch[row["batch_id"]].append(_outcome(row))
    return by_batch


# Per batch, its episodes grouped by status and the names of what they unlocked, with the
# moments of their rewards and steps (see `OutcomeGroup`): PostgreSQL reads 40,000 episodes
# into a few rows, where decoding each one's JSON in Python took most of a second.
_OUTCOME_GROUPS_SQL = """
SELECT batch_id, status, names, count(*),
       avg(total_reward)::float8, coalesce(var_samp(total_reward) * (count(*) - 1), 0)::float8,
       avg(steps)::float8, coalesce(var_samp(steps) * (count(*) - 1), 0)::float8
FROM (
    SELECT batch_id, status, total_reward, steps,
           CASE WHEN jsonb_typeof(achievements) = 'object'
                THEN ARRAY(SELECT jsonb_object_keys(achievements))
                ELSE '{}'::text[] END AS names
    FROM rollouts_episode WHERE batch_id = ANY(%s)
) AS episode
GROUP BY batch_id, status, names
"""


def _outcome_groups_by_batch(batch_ids: Sequence[int]) -> dict[int, list[OutcomeGroup]]:
    """Every episode of the batches, as the groups their summaries need: one query."""
    by_batch: dict[int, list[OutcomeGroup]] = defaultdict(list)
    if connection.vendor != "postgresql":  # the SQLite demo: grouped here, the same groups
        for batch_id, outcomes in _outcomes_by_batch(batch_ids).items():
            by_batch[batch_id] = outcome_groups(outcomes)
        return by_batch
    with connection.cursor() as cursor:
        cursor.execute(_OUTCOME_GROUPS_SQL, [list(batch_ids)])
        rows = cursor.fetchall()
    merged: dict[tuple[int, str, frozenset[str]], OutcomeGroup] = {}
    for batch_id, status, names, count, reward, reward_squares, steps, steps_squares in rows:
        group = OutcomeGroup(
            status=status,
            achievements=frozenset(names),
            rewards=Moments(count, reward, reward_squares),
            steps=Moments(count, steps, steps_squares),
        )
        # The same names in another order are the same kind of episode.
        key = (batch_id, status, group.achievements)
        if key in merged:
            earlier = merged[key]
            group = dataclasses.replace(
                group, rewards=earlier.rewards + group.rewards, steps=earlier.steps + group.steps
            )
        merged[key] = group
    for (batch_id, _, _), group in merged.items():
        by_batch[batch_id].append(group)
    return by_batch


def outcomes_by_batch(*, batch_ids: Sequence[int]) -> dict[int, list[EpisodeOutcome]]:
    """Every episode of the batches as plain outcomes, by batch id: one query."""
    return _outcomes_by_batch(batch_ids)


def batches_compare(*, batch_ids: Sequence[int]) -> BatchComparison:
    """The batches on the seeds all of them played; differences against the first.

    Three queries whatever the batch sizes (two when cached). Episodes that failed on a
    shared seed stay in the counts (`Summary.failed`) and in
    `PairedComparison.unpaired_seeds`.
    """
    if len(batch_ids) < 2:
        raise ComparisonError("compare at least two batches")
    if len(batch_ids) > MAX_COMPARED_BATCHES:
        raise ComparisonError(f"compare at most {MAX_COMPARED_BATCHES} batches at once")
    found = {b.id: b for b in RolloutBatch.objects.filter(id__in=batch_ids)}
    missing = [str(i) for i in batch_ids if i not in found]
    if missing:
        raise ComparisonError(f"there is no batch {', '.join(missing)}")
    batches = [found[i] for i in batch_ids]
    # The batches' creation times too: ids restart in a database created again (tests, a
    # reset demo) while the shared cache keeps its entries.
    comparison = _cached_statistics(
        "compare",
        [(b.id, b.created_at) for b in batches],
        batch_ids,
        lambda: _compare(batches),
    )
    # The batch rows as they are now (a name may have changed since it was cached).
    return dataclasses.replace(
        comparison,
        columns=[dataclasses.replace(c, batch=found[c.batch.id]) for c in comparison.columns],
        differences=[
            dataclasses.replace(d, batch=found[d.batch.id], against=found[d.against.id])
            for d in comparison.differences
        ],
    )


def _compare(batches: list[RolloutBatch]) -> BatchComparison:
    batch_ids = [b.id for b in batches]
    outcomes = _outcomes_by_batch(batch_ids)
    seed_sets = [{o.seed for o in outcomes[b.id]} for b in batches]
    shared = set.intersection(*seed_sets)
    if not shared:
        names = " and ".join(str(b.id) for b in batches)
        raise ComparisonError(f"batches {names} share no seed")
    on_shared = {b.id: [o for o in outcomes[b.id] if o.seed in shared] for b in batches}
    columns = [
        BatchColumn(
            batch=b,
            summary=summarize(on_shared[b.id]),
            left_out_seeds=sorted(seeds - shared),
        )
        for b, seeds in zip(batches, seed_sets, strict=True)
    ]
    first = batches[0]
    differences = [
        Difference(
            batch=b,
            against=first,
            paired=paired_comparison(base=on_shared[first.id], other=on_shared[b.id]),
        )
        for b in batches[1:]
    ]
    episode_ids: dict[tuple[int, int], list[int]] = defaultdict(list)
    for b in batches:
        for o in on_shared[b.id]:
            episode_ids[(b.id, o.seed)].append(o.episode_id)
    return BatchComparison(
        shared_seeds=sorted(shared),
        columns=columns,
        differences=differences,
        episode_ids=dict(episode_ids),
    )


@dataclass(frozen=True)
class SeedColumn:
    batch: RolloutBatch
    episode: Episode | None
    frames: list[str]  # sha256 by step
    turn_steps: list[int]  # the frame step each turn saw, by turn index


def seed_episodes(*, batch_ids: Sequence[int], seed: int) -> list[SeedColumn]:
    """Each batch's episode on one seed (its first sample), with frames: four queries."""
    if not 1 <= len(batch_ids) <= MAX_COMPARED_BATCHES:
        raise ComparisonError(f"pick 1 to {MAX_COMPARED_BATCHES} batches")
    if not 0 <= seed <= MAX_SEED:
        raise ComparisonError(f"seed {seed} is not between 0 and {MAX_SEED}")
    found = {b.id: b for b in RolloutBatch.objects.filter(id__in=batch_ids)}
    missing = [str(i) for i in batch_ids if i not in found]
    if missing:
        raise ComparisonError(f"there is no batch {', '.join(missing)}")
    episodes: dict[int, Episode] = {}
    for episode in Episode.objects.filter(batch_id__in=batch_ids, seed=seed).order_by("-id"):
        episodes[episode.batch_id] = episode  # lowest id last: the first sample wins
    frames: dict[int, list[str]] = defaultdict(list)
    for episode_id, sha in (
        Frame.objects.filter(episode__in=episodes.values())
        .order_by("episode_id", "step")
        .values_list("episode_id", "sha256")
    ):
        frames[episode_id].append(sha)
    turn_steps: dict[int, list[int]] = defaultdict(list)
    for episode_id, step in (
        Turn.objects.filter(episode__in=episodes.values())
        .order_by("episode_id", "index")
        .values_list("episode_id", "frame__step")
    ):
        turn_steps[episode_id].append(step)
    columns = []
    for batch_id in batch_ids:
        episode = episodes.get(batch_id)
        key = episode.id if episode else -1
        columns.append(
            SeedColumn(
                batch=found[batch_id],
                episode=episode,
                frames=frames.get(key, []),
                turn_steps=turn_steps.get(key, []),
            )
        )
    return columns


# Whose play a leaderboard row pools. A fork replays another episode's opening turns (with a
# correction, one of them a person's action) and a person's game is no model's: neither is a
# model's own play, so they are left out of its row and shown, when asked, on rows of their own.
OWN_PLAY = "own"
FORK_PLAY = "fork"
HUMAN_PLAY = "human"


@dataclass(frozen=True)
class LeaderboardRow:
    label: str
    summary: Summary | None  # None for a reference row
    play: str = OWN_PLAY  # OWN_PLAY, FORK_PLAY or HUMAN_PLAY
    reference_score: float | None = None
    policy: str = ""
    model: str = ""
    observation_mode: str = ""
    image_size: int | None = None
    history_frames: int | None = None
    step_limit: int | None = None
    batch_ids: list[int] = field(default_factory=list)

    @property
    def is_reference(self) -> bool:
        return self.summary is None

    @property
    def score(self) -> float:
        return self.reference_score if self.summary is None else self.summary.crafter_score

    @property
    def is_own_play(self) -> bool:
        """A policy's own games (or the paper's agents): the rows that are ranked."""
        return self.play == OWN_PLAY


def _configuration(batch: dict[str, Any]) -> tuple[Any, ...]:
    settings = batch["settings"] if isinstance(batch["settings"], dict) else {}
    kind = policy_kind_or_none(batch["policy"])
    plays_a_model = kind is not None and kind.calls_model
    # The step limit is part of the configuration: a 256-step score and a 10,000-step score
    # measure different things, and pooling them would make a number nobody asked for.
    return (
        batch["policy"],
        batch["model"] if plays_a_model else "",
        str(settings.get("observation_mode", "image_text")) if plays_a_model else "",
        batch["image_size"],
        int(settings.get("history_frames", 0) or 0) if plays_a_model else 0,
        batch["step_limit"],
    )


def _shows_history(policy: str) -> bool:
    kind = policy_kind_or_none(policy)
    return kind is not None and kind.shows_history


def _play(batch: dict[str, Any]) -> str:
    if batch["policy"] == RolloutBatch.Policy.HUMAN:
        return HUMAN_PLAY
    return FORK_PLAY if batch["forked"] else OWN_PLAY


def leaderboard_rows(*, include_forks: bool = False) -> list[LeaderboardRow]:
    """Every configuration with finished batches, pooled over them, and the paper's agents.

    A policy's own games only, unless `include_forks`: then forks and people's games too, on
    rows of their own (`LeaderboardRow.play`). Three queries: finished batches (with whether
    they are forks), their episodes' signature, then (unless the cache has these batches' rows
    for that signature) their episodes.
    """
    fork = Episode.objects.filter(batch_id=OuterRef("id")).filter(
        # A fork whose original was deleted keeps its turn: still a replay.
        Q(forked_from__isnull=False) | Q(forked_at_turn__isnull=False)
    )
    batches = list(
        RolloutBatch.objects.filter(status=RolloutBatch.Status.FINISHED)
        .exclude(policy=RolloutBatch.Policy.IMPORTED)
        .annotate(forked=Exists(fork))
        .order_by("id")
        # created_at for the cache key only: ids restart in a database created again.
        .values(
            "id", "policy", "model", "image_size", "step_limit", "settings", "created_at", "forked"
        )
    )
    ids = [b["id"] for b in batches]
    rows = _cached_statistics("leaderboard", batches, ids, lambda: _leaderboard(batches))
    return [row for row in rows if include_forks or row.is_own_play]


def _leaderboard(batches: list[dict[str, Any]]) -> list[LeaderboardRow]:
    groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for batch in batches:
        groups[(_play(batch), *_configuration(batch))].append(batch["id"])
    outcomes = _outcome_groups_by_batch([b["id"] for b in batches])
    rows = []
    for (play, policy, model, mode, size, history, steps), ids in groups.items():
        pooled = [group for batch_id in ids for group in outcomes.get(batch_id, [])]
        if not pooled:
            continue
        rows.append(
            LeaderboardRow(
                label=model or policy,
                summary=summarize_groups(pooled),
                play=play,
                policy=policy,
                model=model,
                observation_mode=mode,
                image_size=size,
                history_frames=history if _shows_history(policy) else None,
                step_limit=steps,
                batch_ids=ids,
            )
        )
    for key, score in reference_scores()["paper_scores"].items():
        rows.append(
            LeaderboardRow(
                label=REFERENCE_LABELS.get(key, key), summary=None, reference_score=score
            )
        )
    return sorted(rows, key=lambda row: (-row.score, row.is_reference, row.label))


@cache
def reference_scores() -> dict[str, Any]:
    """The Crafter paper's numbers, from the copy kept in this app (see its `source`)."""
    return json.loads(REFERENCE_FILE.read_text())


def held_out_seeds_for(*, used: Iterable[tuple[int, int]], count: int) -> list[int]:
    """`count` seeds no (batch, seed) pair in `used` played, the same ones every time.

    A seed is a world: a seed played in any batch of the training data is seen, whichever
    batch it was, so only the seed half of each pair matters.
    """
    return held_out_seeds(used={seed for _, seed in used}, count=count)


def batch_seed_pairs(*, episode_ids: Iterable[int]) -> set[tuple[int, int]]:
    """(batch, seed) of the given episodes: what a dataset version was built from."""
    return set(Episode.objects.filter(id__in=list(episode_ids)).values_list("batch_id", "seed"))


def dataset_version_seed_pairs(*, version: DatasetVersion) -> set[tuple[int, int]]:
    """(batch, seed) of every episode the version's filters select.

    The filters are run again, now: episodes recorded after the export that match them are
    included too, which can only make the held-out seeds more conservative, never less.
    """
    filters = TurnSelection.from_json(version.filters)
    episode_ids = turns_selected(filters).values("episode_id")
    return set(Episode.objects.filter(id__in=episode_ids).values_list("batch_id", "seed"))


@dataclass(frozen=True)
class HeldOutPlan:
    """What "Evaluate" on a training job needs: the seeds, and base-model batches on them."""

    seeds: list[int]
    base_batches: list[RolloutBatch]  # newest first; the first is the one to compare with


def held_out_plan(*, version: DatasetVersion, count: int, base_model: str) -> HeldOutPlan:
    """`count` seeds the version's episodes never played, and the base model's batches that
    played all of them (so the fine-tuned model's batch can be compared straight away)."""
    seeds = held_out_seeds_for(used=dataset_version_seed_pairs(version=version), count=count)
    return HeldOutPlan(
        seeds=seeds, base_batches=batches_covering_seeds(model=base_model, seeds=seeds)
    )
