"""Vision checkpoints: probe sets (questions on recorded frames, each with the one right
answer the game's stored state gives), runs of a model over a set, and its answers."""

from __future__ import annotations

from django.conf import settings as django_settings
from django.db import models

from probes.results import Tally
from studio.models import ClaimedJob


class ProbeSet(models.Model):
    """Questions made from a selection of recorded frames with a seed: the same selection
    and seed give the same questions in the same order with the same shuffled choices."""

    name = models.CharField(max_length=200, blank=True)
    seed = models.BigIntegerField(default=0)
    kinds = models.JSONField(default=list)  # kind names, in the order they were asked for
    # Frames sampled per episode; null: every eligible frame.
    per_episode = models.PositiveIntegerField(null=True, blank=True)
    balanced = models.BooleanField(default=False)
    filters = models.JSONField(default=dict, blank=True)  # the selection, as datasets store it
    questions_count = models.PositiveIntegerField(default=0)
    frames_count = models.PositiveIntegerField(default=0)
    episodes_count = models.PositiveIntegerField(default=0)
    answers = models.JSONField(default=dict, blank=True)  # {kind: {answer: count}}
    created_by = models.ForeignKey(
        django_settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.name or f"Probe set {self.pk}"

    @property
    def kinds_with_questions(self) -> list[str]:
        """Its kinds that have a question, in its order: a kind asked for can have none (no
        frame gave it one answer, or balancing left it out)."""
        stored = self.answers if isinstance(self.answers, dict) else {}
        asked = [k for k in (self.kinds or []) if isinstance(k, str)]
        return [k for k in asked + [k for k in stored if k not in asked] if stored.get(k)]


class ProbeQuestion(models.Model):
    """One multiple-choice question on one frame; `answer` is one of `choices`."""

    probe_set = models.ForeignKey(ProbeSet, on_delete=models.CASCADE, related_name="questions")
    index = models.PositiveIntegerField()
    frame = models.ForeignKey("rollouts.Frame", on_delete=models.CASCADE, related_name="+")
    # The turn whose observation_text is the frame's text observation (the text control).
    turn = models.ForeignKey(
        "rollouts.Turn", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Kept on the question so that a split by episode needs no join through the frame.
    episode = models.ForeignKey("rollouts.Episode", on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=40)
    subject = models.CharField(max_length=40, blank=True)
    text = models.TextField()
    choices = models.JSONField(default=list)
    answer = models.CharField(max_length=100)

    class Meta:
        ordering = ["probe_set_id", "index"]
        constraints = [
            models.UniqueConstraint(
                fields=["probe_set", "index"], name="probe_question_unique_set_index"
            ),
        ]
        indexes = [models.Index(fields=["probe_set", "kind"], name="probe_question_kind_idx")]

    def __str__(self) -> str:
        return f"Question {self.index} of set {self.probe_set_id}"


class ProbeRun(ClaimedJob):
    """A model asked every question of a set, in chunks a worker claims."""

    class Status(models.TextChoices):
        # A job's statuses (`ClaimedJob.Status`), and a cancel's end, as a batch has.
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"
        CANCELED = "canceled"

    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)

    class Observation(models.TextChoices):
        IMAGE = "image", "Frame (image)"
        TEXT = "text", "Text observation (control)"
        NONE = "none", "Question alone (control)"

    probe_set = models.ForeignKey(ProbeSet, on_delete=models.CASCADE, related_name="runs")
    endpoint_name = models.CharField(max_length=60)
    # The endpoint's URL when the run was created: its answers all come from there (a run
    # whose endpoint an admin points elsewhere stops rather than mix two servers' answers).
    base_url = models.URLField(max_length=500, blank=True)
    model = models.CharField(max_length=200)
    observation = models.CharField(
        max_length=10, choices=Observation.choices, default=Observation.IMAGE
    )
    concurrency = models.PositiveIntegerField(default=4)
    questions_total = models.PositiveIntegerField(default=0)
    # Answers stored, errors included: how far the run got. What accuracy is over (the
    # answers naming a choice) is `tally.answered`.
    answered = models.PositiveIntegerField(default=0)
    correct = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    model_calls = models.PositiveIntegerField(default=0)
    model_retries = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"Probe run {self.pk} of set {self.probe_set_id} ({self.model}, {self.observation})"

    @property
    def tally(self) -> Tally:
        """Its counters read by `probes.results`' rules: accuracy over the answered."""
        return Tally(asked=self.answered, errors=self.errors, correct=self.correct)


class ProbeAnswer(models.Model):
    """What a model answered to one question in one run."""

    run = models.ForeignKey(ProbeRun, on_delete=models.CASCADE, related_name="answers")
    question = models.ForeignKey(ProbeQuestion, on_delete=models.CASCADE, related_name="+")
    # The choice the model picked; "" when none could be read from its answer.
    choice = models.CharField(max_length=100, blank=True)
    correct = models.BooleanField(default=False)
    model_text = models.TextField(blank=True)  # cleaned and bounded (studio.untrusted)
    error = models.TextField(blank=True)
    error_kind = models.CharField(max_length=40, blank=True)
    latency_ms = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    retries = models.PositiveSmallIntegerField(default=0)
    flagged = models.BooleanField(default=False)
    note = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run_id", "question_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "question"], name="probe_answer_unique_run_question"
            ),
        ]

    def __str__(self) -> str:
        return f"Answer to question {self.question_id} in run {self.run_id}"


class ProbeRunChunk(ClaimedJob):
    """Questions `first` to `last - 1` (by index) of a run: one Celery task claims and asks
    them, skipping those already answered, so a chunk taken over after a crash resumes."""

    run = models.ForeignKey(ProbeRun, on_delete=models.CASCADE, related_name="chunks")
    index = models.PositiveIntegerField()
    first = models.PositiveIntegerField()
    last = models.PositiveIntegerField()
    # The worker holding the claim (Celery's node name): one that starts again under the same
    # name takes its chunks over at once (`studio.claim_keeper`).
    worker = models.CharField(max_length=200, blank=True, default="", db_default="")

    class Meta:
        ordering = ["run_id", "index"]
        constraints = [
            models.UniqueConstraint(fields=["run", "index"], name="probe_chunk_unique_run_index"),
        ]

    def __str__(self) -> str:
        return f"Chunk {self.index} of probe run {self.run_id}"
