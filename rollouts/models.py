"""Rollout batches, episodes, frames and turns: everything a played game leaves behind."""

from __future__ import annotations

from django.conf import settings as django_settings
from django.db import models
from django.db.models import Q

from rollouts.policies.kinds import (
    NAME_MAX_LENGTH,
    PolicyKind,
    policy_choices,
    policy_kind_or_none,
)
from studio.models import ClaimedJob

# Flag and annotate turns, start batches, play and fork (Turn's own permission; the pages of
# every app that start games or change turns ask for it).
REVIEW_PERMISSION = "rollouts.review_turn"


class RolloutBatch(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        FINISHED = "finished"
        FAILED = "failed"
        CANCELED = "canceled"

    class Policy(models.TextChoices):
        """The built-in kinds' names, for queries that mean one of them. What a kind is and
        does, and the field's choices, are its declaration's (`rollouts.policies.kinds`)."""

        SCRIPTED = "scripted"
        RANDOM = "random"
        OPENAI = "openai"
        IMPORTED = "imported"
        HUMAN = "human"

    name = models.CharField(max_length=200, blank=True)
    # A callable: a new kind changes no migration.
    policy = models.CharField(max_length=NAME_MAX_LENGTH, choices=policy_choices)
    model = models.CharField(max_length=200, blank=True)
    endpoint = models.CharField(max_length=500, blank=True, help_text="Base URL; never a key.")
    endpoint_name = models.CharField(
        max_length=60, blank=True, help_text="The admin-named endpoint; empty for a CLI URL."
    )
    seeds = models.JSONField(default=list)
    step_limit = models.PositiveIntegerField(default=256)
    image_size = models.PositiveIntegerField(default=64)
    settings = models.JSONField(default=dict, blank=True)
    # The system prompt the batch's model was sent (rollouts.game.tools.PROMPT_VERSION and text):
    # the prompt's wording changes, a batch keeps what it saw. Blank for baselines.
    prompt_version = models.PositiveSmallIntegerField(default=0)
    system_prompt = models.TextField(blank=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    error = models.TextField(blank=True)

    episodes_total = models.PositiveIntegerField(default=0)
    episodes_finished = models.PositiveIntegerField(default=0)
    episodes_failed = models.PositiveIntegerField(default=0)
    model_calls = models.PositiveIntegerField(default=0)
    model_errors = models.PositiveIntegerField(default=0)
    model_retries = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)

    created_by = models.ForeignKey(
        django_settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    # Set by a training job's "Evaluate": the job whose held-out seeds this batch plays, with
    # its fine-tuned model, or with its base model (the baseline); `model` says which.
    evaluates = models.ForeignKey(
        "training.TrainingJob",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="evaluation_batches",
    )
    crafter_version = models.CharField(max_length=40, blank=True)
    numpy_version = models.CharField(max_length=40, blank=True)
    opensimplex_version = models.CharField(max_length=40, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "rollout batch"
        verbose_name_plural = "rollout batches"
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(step_limit__gte=1), name="batch_step_limit_positive"
            ),
            models.CheckConstraint(
                condition=Q(image_size__gte=9) & Q(image_size__lte=1024),
                name="batch_image_size_range",
            ),
            models.CheckConstraint(
                condition=Q(episodes_finished__lte=models.F("episodes_total"))
                & Q(episodes_failed__lte=models.F("episodes_total")),
                name="batch_progress_within_total",
            ),
        ]

    def __str__(self) -> str:
        return self.name or f"Batch {self.pk}"

    @property
    def policy_kind(self) -> PolicyKind:
        """What its policy is and does: templates ask `batch.policy_kind.calls_model`. A kind
        no longer declared reads as one that neither plays nor calls."""
        return policy_kind_or_none(self.policy) or PolicyKind(
            name=self.policy, offered=False, plays=False
        )

    @property
    def episodes_done(self) -> int:
        return self.episodes_finished + self.episodes_failed

    @property
    def progress_percent(self) -> int:
        return int(100 * self.episodes_done / self.episodes_total) if self.episodes_total else 0

    def _share(self, count: int) -> float:
        return round(100 * count / self.episodes_total, 2) if self.episodes_total else 0.0

    @property
    def finished_percent(self) -> float:
        return self._share(self.episodes_finished)

    @property
    def failed_percent(self) -> float:
        return self._share(self.episodes_failed)


class Episode(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        FINISHED = "finished"
        FAILED = "failed"
        # Stopped by its batch's Cancel: what it played is kept (reviewable, left out of
        # datasets) and its calls counted; the batch counts it among `episodes_failed`.
        CANCELED = "canceled"

    batch = models.ForeignKey(RolloutBatch, on_delete=models.CASCADE, related_name="episodes")
    seed = models.BigIntegerField()
    # Which of the batch's `samples_per_seed` plays of this seed; it also seeds the policy's
    # own sampling (rollouts.policies.base.policy_seed), so a rerun replays the same samples.
    sample = models.PositiveSmallIntegerField(default=0)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    steps = models.PositiveIntegerField(default=0)
    total_reward = models.FloatField(default=0.0)
    # The reward a reinforcement-learning run gave the episode (its TOML's chosen reward:
    # crafter's own, the Crafter score, named achievements); null for every other episode.
    rl_reward = models.FloatField(null=True, blank=True)
    # {achievement name: step at which it was first unlocked}
    achievements = models.JSONField(default=dict, blank=True)
    achievement_count = models.PositiveSmallIntegerField(default=0)
    tool_calls = models.PositiveIntegerField(default=0)
    model_calls = models.PositiveIntegerField(default=0)
    model_errors = models.PositiveIntegerField(default=0)
    model_retries = models.PositiveIntegerField(default=0)
    bad_outputs = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    error = models.TextField(blank=True)
    # A fork replays `forked_from`'s executed actions up to turn `forked_at_turn`, then plays
    # on with its own policy. Its first `fork_prefix_turns` turns are that replay (plus, for a
    # fork "with the correction", the corrected turn): exports leave them out by default.
    forked_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="forks"
    )
    forked_at_turn = models.PositiveIntegerField(null=True, blank=True)
    fork_prefix_turns = models.PositiveIntegerField(default=0)
    fork_with_correction = models.BooleanField(default=False)
    attempts = models.PositiveSmallIntegerField(default=0)
    claim_token = models.CharField(max_length=64, blank=True)
    # The worker holding the claim (Celery's node name): one that starts again under the same
    # name takes its episodes over at once, instead of waiting for them to go stale.
    # Defaults in the database too: rows written in SQL (a seeded benchmark) need not name it.
    worker = models.CharField(max_length=200, blank=True, default="", db_default="")
    # The last takeover: when the episode's worker was found gone, the turn its replay
    # resumed from, and what went wrong with the replay if it had to start over.
    lost_worker_at = models.DateTimeField(null=True, blank=True)
    resumed_from_turn = models.PositiveIntegerField(null=True, blank=True)
    resume_note = models.TextField(blank=True, default="", db_default="")
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # When a message was last handed to the broker; null: never (the broker was down).
    enqueued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["batch_id", "seed", "sample"]
        constraints = [
            models.UniqueConstraint(
                fields=["batch", "seed", "sample"], name="episode_unique_batch_seed_sample"
            ),
        ]
        indexes = [
            models.Index(fields=["status", "heartbeat_at"]),
            # The turn list sorted by seed or batch walks the episodes in that order (and
            # each one's turns off the turn indexes), stopping at the page's end.
            models.Index(fields=["seed", "id"], name="episode_seed_order_idx"),
            models.Index(fields=["batch", "id"], name="episode_batch_order_idx"),
        ]

    def __str__(self) -> str:
        if self.sample:
            return f"Episode {self.pk} (seed {self.seed}, sample {self.sample})"
        return f"Episode {self.pk} (seed {self.seed})"


class Frame(models.Model):
    """What the agent saw before its `step`-th action; step 0 is the frame after `reset()`."""

    episode = models.ForeignKey(Episode, on_delete=models.CASCADE, related_name="frames")
    step = models.PositiveIntegerField()
    # The PNG lives once in storage under its sha256, however many frames share it.
    sha256 = models.CharField(max_length=64, db_index=True)
    image = models.FileField(max_length=200)
    width = models.PositiveSmallIntegerField()
    height = models.PositiveSmallIntegerField()
    # inventory, vitals, position, facing, achievements at this step
    state = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["episode_id", "step"]
        constraints = [
            models.UniqueConstraint(fields=["episode", "step"], name="frame_unique_episode_step"),
            models.CheckConstraint(
                condition=Q(sha256__regex=r"^[0-9a-f]{64}$"), name="frame_sha256_hex"
            ),
        ]

    def __str__(self) -> str:
        return f"Frame {self.step} of episode {self.episode_id}"


class Turn(models.Model):
    """One decision: the request the policy saw, what it answered, what was executed."""

    episode = models.ForeignKey(Episode, on_delete=models.CASCADE, related_name="turns")
    index = models.PositiveIntegerField()
    frame = models.ForeignKey(Frame, on_delete=models.PROTECT, related_name="turns")
    observation_text = models.TextField(blank=True)
    # Chat messages as sent; image parts hold {"frame_step": N} instead of base64.
    request_messages = models.JSONField(default=list, blank=True)
    model_text = models.TextField(blank=True, null=True)  # noqa: DJ001  null = no text at all
    reasoning_text = models.TextField(blank=True)
    tool_calls = models.JSONField(default=list, blank=True)
    actions = models.JSONField(default=list, blank=True)
    reward = models.FloatField(default=0.0)
    # The policy-gradient advantage its episode's group gave this turn in a reinforcement
    # learning run (GRPO: the episode's reward against its group's, the same for each of its
    # turns); null for every other turn.
    advantage = models.FloatField(null=True, blank=True)
    achievements_unlocked = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True)
    error_kind = models.CharField(max_length=40, blank=True)
    finish_reason = models.CharField(max_length=40, blank=True)
    text_fallback = models.BooleanField(default=False, help_text="Actions parsed from text.")
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    latency_ms = models.PositiveIntegerField(default=0)
    retries = models.PositiveSmallIntegerField(default=0)
    # Answer fields cut to fit when stored: {"model_text": size in bytes before the cut, ...}.
    truncated = models.JSONField(default=dict, blank=True)
    flagged = models.BooleanField(default=False)  # indexed by turn_list_flagged_idx
    note = models.TextField(blank=True)
    reviewed_by = models.ForeignKey(
        django_settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    reviewed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["episode_id", "index"]
        constraints = [
            models.UniqueConstraint(fields=["episode", "index"], name="turn_unique_episode_index"),
        ]
        # The turn list's order (newest episode first, turns in play order) and its filters
        # that keep few rows: a page of 50 is read straight off the index at any table size.
        # PostgreSQL also has, in the same order, one partial index per unlocked achievement
        # and for reward > 0 / < 0, and trigram GIN indexes for the search (migration 0013).
        indexes = [
            models.Index(fields=["-episode", "index"], name="turn_list_order_idx"),
            models.Index(
                fields=["-episode", "index"],
                name="turn_list_flagged_idx",
                condition=models.Q(flagged=True),
            ),
            models.Index(
                fields=["-episode", "index"],
                name="turn_list_error_idx",
                condition=~models.Q(error=""),
            ),
            # The batch page: its episodes' error counts (error or error_kind set: this index
            # or-ed with turn_list_error_idx) and mean latency are read from these (a few MB
            # for a batch of 256,000 turns) instead of every turn row.
            models.Index(
                fields=["episode"],
                name="turn_episode_error_kind_idx",
                condition=~models.Q(error_kind=""),
            ),
            models.Index(
                fields=["episode", "latency_ms"],
                name="turn_episode_latency_idx",
                condition=models.Q(latency_ms__gt=0),
            ),
            # The episode viewer's index of a 10,000-turn episode, read off the index alone
            # (a VLM turn's row is kilobytes wide) with its few unlocking turns beside it.
            models.Index(
                fields=["episode", "index"],
                include=["frame", "flagged", "reward"],
                name="turn_viewer_idx",
            ),
            models.Index(
                fields=["episode", "index"],
                name="turn_unlocked_idx",
                condition=~models.Q(achievements_unlocked=[]),
            ),
            # The turn list sorted by turn index or by reward (rollouts.review.selectors
            # .turn_list_page), in those orders; with the flag and the reward beside the keys,
            # a page's keys (episode, index), and its "flagged" and reward filters, come from
            # the index alone (a turn's row is kilobytes wide). By reward, a filter on
            # episodes reads each value's turns episode by episode (turn_episode_reward_idx).
            models.Index(
                fields=["index", "episode"],
                include=["flagged", "reward"],
                name="turn_sort_index_idx",
            ),
            models.Index(
                fields=["-index", "episode"],
                include=["flagged", "reward"],
                name="turn_sort_index_desc_idx",
            ),
            models.Index(
                fields=["reward", "episode", "index"],
                include=["flagged"],
                name="turn_sort_reward_idx",
            ),
            models.Index(
                fields=["episode", "reward", "index"],
                include=["flagged"],
                name="turn_episode_reward_idx",
            ),
        ]
        permissions = [("review_turn", "Can flag and annotate turns and start batches")]

    def __str__(self) -> str:
        return f"Turn {self.index} of episode {self.episode_id}"


class TurnBulkFlag(ClaimedJob):
    """Flag or unflag every turn a turn-list filter matches: a job the worker runs in chunks.

    Millions of turns cannot be updated inside a web request; the row, not the broker, is
    the truth about how far the job got (`changed`, `last_turn_id`).
    """

    filters = models.JSONField(default=dict)  # the turn list's TurnSelection, as JSON
    flagged = models.BooleanField()
    # Turns to change when the job was asked for; PostgreSQL's estimate past a bound.
    total = models.PositiveBigIntegerField(default=0)
    total_estimated = models.BooleanField(default=False)
    changed = models.PositiveBigIntegerField(default=0)
    # Turns are taken in id order: a job resumed after a crash starts past this one.
    last_turn_id = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"Bulk {'flag' if self.flagged else 'unflag'} {self.pk} ({self.status})"

    @property
    def percent(self) -> int:
        if self.status == self.Status.DONE:
            return 100
        if not self.total:
            return 0
        # An estimated total may be passed: never show 100% before the job says done.
        return min(99, int(100 * self.changed / self.total))


class TurnRelabel(models.Model):
    """The actions a reviewer says a turn should have taken; the turn itself is kept as is."""

    turn = models.OneToOneField(Turn, on_delete=models.CASCADE, related_name="relabel")
    actions = models.JSONField(default=list)
    reason = models.TextField(blank=True)
    labeled_by = models.ForeignKey(
        django_settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    labeled_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["turn_id"]

    def __str__(self) -> str:
        return f"Relabel of turn {self.turn_id}: {' '.join(self.actions)}"
