"""Datasets: saved filters over turns, and their immutable exported versions."""

from __future__ import annotations

from django.conf import settings as django_settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from curation.row_formats import find_format
from studio.models import ClaimedJob


class Dataset(models.Model):
    """A saved filter over turns (`rollouts.review.turn_selection.TurnSelection`) and export
    options."""

    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    filters = models.JSONField(default=dict, blank=True)
    export_options = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(
        django_settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at", "-id"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        from curation.export_options import ExportOptions
        from rollouts.review.turn_selection import FilterError, TurnSelection

        try:
            TurnSelection.from_json(self.filters)
            ExportOptions.from_json(self.export_options)
        except FilterError as exc:
            raise ValidationError(str(exc)) from exc


class DatasetVersion(ClaimedJob):
    """One export of a dataset. Once `done`, nothing about it changes (see `save`)."""

    dataset = models.ForeignKey(Dataset, on_delete=models.PROTECT, related_name="versions")
    number = models.PositiveIntegerField()
    # the filter and options exactly as they were when the version was asked for
    filters = models.JSONField(default=dict)
    export_options = models.JSONField(default=dict)
    file = models.FileField(max_length=300, blank=True)
    sha256 = models.CharField(max_length=64, blank=True)
    bytes = models.PositiveBigIntegerField(default=0)
    rows = models.PositiveIntegerField(default=0)
    episodes = models.PositiveIntegerField(default=0)
    images = models.PositiveIntegerField(default=0)
    estimated_tokens = models.PositiveBigIntegerField(default=0)
    # {"val_fraction": F, "val": {"file", "sha256", "rows", "episodes", "images", "bytes"}}
    split = models.JSONField(default=dict, blank=True)
    # The same rows as a Hugging Face dataset for TRL (curation.hf_export), zipped.
    hf_file = models.FileField(max_length=300, blank=True)
    hf_sha256 = models.CharField(max_length=64, blank=True)
    hf_bytes = models.PositiveBigIntegerField(default=0)
    progress_rows = models.PositiveIntegerField(default=0)
    total_rows = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["dataset_id", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["dataset", "number"], name="version_unique_number"),
            models.CheckConstraint(
                condition=~Q(status="done") | Q(sha256__regex=r"^[0-9a-f]{64}$"),
                name="version_done_has_sha256",
            ),
            models.CheckConstraint(
                condition=Q(progress_rows__lte=models.F("total_rows")) | Q(total_rows=0),
                name="version_progress_within_total",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.dataset} v{self.number}"

    def save(self, *args, **kwargs) -> None:
        # An exported version is a record of what was trained on: refuse to rewrite it.
        if self.pk and DatasetVersion.objects.filter(pk=self.pk, status=self.Status.DONE).exists():
            raise ValidationError(f"{self} is done and immutable")
        super().save(*args, **kwargs)

    @property
    def progress_percent(self) -> int:
        if self.status == self.Status.DONE:
            return 100
        return int(100 * self.progress_rows / self.total_rows) if self.total_rows else 0

    @property
    def format_shown(self) -> str:
        """The row format as the versions table names it (its name if no longer declared)."""
        options = self.export_options if isinstance(self.export_options, dict) else {}
        name = options.get("format")
        if name is None:
            return ""
        declared = find_format(str(name))
        return declared.shown if declared else str(name)

    @property
    def val(self) -> dict:
        return (self.split or {}).get("val") or {}


class DatasetImport(ClaimedJob):
    """An uploaded JSONL file being checked and imported by a worker: the row is the truth."""

    class Phase(models.TextChoices):
        WAITING = "waiting"
        CHECKING = "checking"
        WRITING = "writing"
        ENDED = "ended"

    name = models.CharField(max_length=200, blank=True)
    original_name = models.CharField(max_length=200, blank=True)
    upload = models.CharField(max_length=300, help_text="Storage name of the uploaded file.")
    skip_existing = models.BooleanField(default=False)
    phase = models.CharField(max_length=20, choices=Phase.choices, default=Phase.WAITING)
    total_bytes = models.PositiveBigIntegerField(default=0)
    checked_bytes = models.PositiveBigIntegerField(default=0)
    total_lines = models.PositiveIntegerField(default=0)
    written_lines = models.PositiveIntegerField(default=0)
    errors = models.JSONField(default=list, blank=True)  # "line N: ..." strings
    summary = models.JSONField(default=dict, blank=True)
    dataset = models.ForeignKey(
        Dataset, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"import {self.id} ({self.original_name})"

    @property
    def progress_percent(self) -> int:
        """Checking is the first half of the work, writing the second."""
        if self.status == self.Status.DONE:
            return 100
        checked = self.checked_bytes / self.total_bytes if self.total_bytes else 0
        written = self.written_lines / self.total_lines if self.total_lines else 0
        if self.phase == self.Phase.WRITING:
            return int(50 + 50 * min(written, 1))
        return int(50 * min(checked, 1))
