"""Training jobs sent to a fine-tuning provider, and the events the provider reported."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from studio.models import ClaimedJob


def provider_choices() -> list[tuple[str, str]]:
    """The registered training providers (training.providers): a callable, so that a new
    provider needs no migration. Labels as Django's TextChoices gave them ("Synth")."""
    from training.providers import provider_names

    return [(name, name.replace("_", " ").title()) for name in provider_names()]


class TrainingJob(ClaimedJob):
    """One submission of a dataset version to a provider; the row, not the broker, is the truth.

    Remote ids are written the moment the provider returns them, so a task delivered again
    after a crash carries on from there instead of uploading or creating a job twice. No key
    is ever stored here: only the base URL and, for a browser submission, the endpoint name.
    """

    class Status(models.TextChoices):
        PENDING = "pending"  # saved, waiting for the worker
        UPLOADING = "uploading"
        SUBMITTED = "submitted"  # the remote job exists; not yet reported running
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELED = "canceled"

    ACTIVE = (Status.PENDING, Status.UPLOADING, Status.SUBMITTED, Status.RUNNING)
    TERMINAL = (Status.SUCCEEDED, Status.FAILED, Status.CANCELED)

    # None for a reinforcement-learning job ([training] mode = "grpo"): it trains on the
    # episodes it plays, not on a dataset version.
    dataset_version = models.ForeignKey(
        "datasets.DatasetVersion",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="training_jobs",
    )
    validation_version = models.ForeignKey(
        "datasets.DatasetVersion",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="validation_jobs",
    )
    provider = models.CharField(max_length=20, choices=provider_choices, default="synth")
    endpoint_name = models.CharField(
        max_length=60, blank=True, help_text="The admin-named endpoint picked in the browser."
    )
    base_url = models.CharField(max_length=500, help_text="Base URL; never a key.")
    # Where the key comes from on the workers: the NAME of an environment variable.
    api_key_env = models.CharField(max_length=100, blank=True)
    model = models.CharField(max_length=200)
    config_toml = models.TextField(help_text="The TOML exactly as submitted.")
    effective_config = models.JSONField(default=dict)

    # Its own states (a remote job has more than "running"): the claimed one is UPLOADING.
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    cancel_requested = models.BooleanField(default=False)
    # The one cancel of this job under way (asked for however often): its token, sent with
    # its task, and until when it is presumed queued or running; past a provider that was
    # down, until when it waits (`cancel_tries` of them, backing off) before the beat task
    # sends it again.
    cancel_token = models.CharField(max_length=32, blank=True)
    cancel_held_until = models.DateTimeField(null=True, blank=True)
    cancel_tries = models.PositiveSmallIntegerField(default=0)

    # What was uploaded: the version's rows in the provider's format, and their sha256.
    training_file_sha256 = models.CharField(max_length=64, blank=True)
    training_file_bytes = models.PositiveBigIntegerField(default=0)
    training_file_rows = models.PositiveIntegerField(default=0)
    validation_file_sha256 = models.CharField(max_length=64, blank=True)
    validation_file_bytes = models.PositiveBigIntegerField(default=0)
    validation_file_rows = models.PositiveIntegerField(default=0)
    remote_training_file_id = models.CharField(max_length=200, blank=True)
    remote_validation_file_id = models.CharField(max_length=200, blank=True)
    remote_job_id = models.CharField(max_length=200, blank=True)
    # Sent with every creating request (and in the remote job's metadata) so a repeat is
    # recognised; create_attempts > 0 without a remote id means "look before creating".
    idempotency_key = models.CharField(max_length=64, unique=True)
    create_attempts = models.PositiveSmallIntegerField(default=0)

    remote_status = models.CharField(max_length=40, blank=True)
    fine_tuned_model = models.CharField(max_length=300, blank=True)
    trained_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    # The provider's event cursor (synth: last seq; openai: the ids bounding what was read,
    # as JSON, so a backlog longer than one poll takes is read over several polls).
    event_cursor = models.CharField(max_length=1000, blank=True)
    metric_cursor = models.IntegerField(default=-1)

    attempts = models.PositiveIntegerField(default=0)
    submitted_at = models.DateTimeField(null=True, blank=True)
    # Set in the future while a poll holds the job (a lease longer than the poll can last).
    polled_at = models.DateTimeField(null=True, blank=True)
    # Polls in a row whose answer could not be used; the job fails at
    # STUDIO_TRAINING_POLL_FAILURES.
    poll_failures = models.PositiveSmallIntegerField(default=0)
    # When the provider first reported success without naming the model: the status is read
    # again until it names one, or STUDIO_TRAINING_MODEL_WAIT_SECONDS pass.
    success_reported_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        permissions = [("submit_job", "Can submit and cancel training jobs")]
        constraints = [
            models.CheckConstraint(
                condition=~Q(status="succeeded") | ~Q(remote_job_id=""),
                name="training_succeeded_has_remote_job",
            ),
        ]

    def __str__(self) -> str:
        return f"Training job {self.pk} ({self.provider})"

    @property
    def is_active(self) -> bool:
        return self.status in self.ACTIVE

    @property
    def needs_model_refresh(self) -> bool:
        """Reported succeeded by the provider, failed here for want of the model's id."""
        return (
            self.status == self.Status.FAILED
            and self.success_reported_at is not None
            and not self.fine_tuned_model
        )

    @property
    def duration_seconds(self) -> float | None:
        if self.submitted_at is None:
            return None
        from django.utils import timezone

        end = self.finished_at or timezone.now()
        return (end - self.submitted_at).total_seconds()


class TrainingEvent(models.Model):
    """One event the provider reported (or the studio noted), stored once per remote id."""

    class Level(models.TextChoices):
        INFO = "info"
        WARNING = "warning"
        ERROR = "error"

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="events")
    remote_id = models.CharField(max_length=200)
    time = models.DateTimeField()
    level = models.CharField(max_length=20, choices=Level.choices, default=Level.INFO)
    type = models.CharField(max_length=100, blank=True)
    message = models.TextField(blank=True)
    step = models.IntegerField(null=True, blank=True)
    train_loss = models.FloatField(null=True, blank=True)
    validation_loss = models.FloatField(null=True, blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["job_id", "time", "id"]
        constraints = [
            models.UniqueConstraint(fields=["job", "remote_id"], name="training_event_once"),
        ]
        indexes = [
            models.Index(fields=["job", "time"]),
            # The loss chart reads a job's loss rows in step order, losses included, without
            # the table (`training.selectors.job_loss_series`), however many rows it has.
            models.Index(
                fields=["job", "step"],
                include=["train_loss", "validation_loss"],
                condition=Q(step__isnull=False)
                & (Q(train_loss__isnull=False) | Q(validation_loss__isnull=False)),
                name="training_event_loss",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.type or self.level}: {self.message[:60]}"


class LocalRun(ClaimedJob):
    """The "remote" side of a `trl` job: training on a machine of ours, by a worker that
    consumes the `train` queue. One per job; the `trl` provider reads it as any provider's
    API is read (state, events, metrics) and asks it to stop (`cancel_requested`)."""

    class Status(models.TextChoices):
        PENDING = "pending"  # waiting for a train worker
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"
        CANCELED = "canceled"

    job = models.OneToOneField(TrainingJob, on_delete=models.CASCADE, related_name="local_run")
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    cancel_requested = models.BooleanField(default=False)
    step = models.PositiveIntegerField(default=0)
    total_steps = models.PositiveIntegerField(default=0)
    # The step of the latest checkpoint in storage (0: none yet): where a next worker resumes.
    checkpoint_step = models.PositiveIntegerField(default=0)
    attempts = models.PositiveIntegerField(default=0)
    fine_tuned_model = models.CharField(max_length=300, blank=True)
    model_sha256 = models.CharField(max_length=64, blank=True)
    train_loss = models.FloatField(null=True, blank=True)

    def __str__(self) -> str:
        return f"Local run {self.pk} of job {self.job_id} ({self.status})"


class LocalRunEvent(models.Model):
    """An event or a metric point of a local run, numbered (its id) for the provider's
    cursors. A metric point is kept once per (run, name, step): a run resumed from a
    checkpoint logs its steps since then again, and the curve must not show them twice."""

    class Kind(models.TextChoices):
        EVENT = "event"
        METRIC = "metric"

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(LocalRun, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    time = models.DateTimeField()
    level = models.CharField(max_length=20, default="info")
    type = models.CharField(max_length=100, blank=True)
    message = models.TextField(blank=True)
    # A metric point: "train" or "validation", its step and value.
    name = models.CharField(max_length=20, blank=True)
    step = models.IntegerField(null=True, blank=True)
    value = models.FloatField(null=True, blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["run_id", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "name", "step"],
                condition=Q(kind="metric"),
                name="local_run_metric_once",
            ),
        ]
        indexes = [models.Index(fields=["run", "kind", "id"], name="local_run_event_cursor")]

    def __str__(self) -> str:
        return f"{self.kind} {self.type or self.name}: {self.message[:60]}"


class GrpoIteration(models.Model):
    """One iteration of a GRPO job: its episodes (a batch, `group_size` samples of each of its
    seeds, played by the policy as it was after `checkpoint_step` updates), their rewards and
    the trainer's update. Written as it is played; `complete` once every episode is scored.

    A run resumed from a checkpoint removes the iterations after it (their update was lost
    with the worker) and plays them again: an iteration's episodes are never recorded twice.
    """

    class Status(models.TextChoices):
        PLAYING = "playing"
        COMPLETE = "complete"
        CANCELED = "canceled"

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="grpo_iterations")
    number = models.PositiveIntegerField()  # 1-based; the trainer's step once it is applied
    batch = models.OneToOneField(
        "rollouts.RolloutBatch", on_delete=models.PROTECT, related_name="grpo_iteration"
    )
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PLAYING)
    # The policy that played: the trainer's step its weights come from (0: the base model).
    checkpoint_step = models.PositiveIntegerField(default=0)
    seeds = models.JSONField(default=list)
    group_size = models.PositiveSmallIntegerField()
    reward = models.CharField(max_length=500)  # the TOML's reward, as written
    episodes = models.PositiveIntegerField(default=0)  # scored episodes
    # The episodes' chosen reward: mean and its 95% interval (Student's t over episodes).
    reward_mean = models.FloatField(null=True, blank=True)
    reward_low = models.FloatField(null=True, blank=True)
    reward_high = models.FloatField(null=True, blank=True)
    # The Crafter score of the iteration's episodes and each achievement's success rate.
    score = models.FloatField(null=True, blank=True)
    success_rates = models.JSONField(default=dict, blank=True)
    # What the trainer logged for this iteration's update.
    loss = models.FloatField(null=True, blank=True)
    kl = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job_id", "number"]
        constraints = [
            models.UniqueConstraint(fields=["job", "number"], name="grpo_iteration_once"),
        ]

    def __str__(self) -> str:
        return f"Iteration {self.number} of job {self.job_id} ({self.status})"
