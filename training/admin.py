from django.contrib import admin

from training.models import GrpoIteration, LocalRun, TrainingEvent, TrainingJob


class TrainingEventInline(admin.TabularInline):
    model = TrainingEvent
    extra = 0
    fields = ["time", "level", "type", "message", "step", "train_loss", "validation_loss"]
    readonly_fields = fields
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(TrainingJob)
class TrainingJobAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "provider",
        "status",
        "dataset_version",
        "model",
        "remote_job_id",
        "fine_tuned_model",
        "created_by",
        "created_at",
    ]
    list_filter = ["status", "provider"]
    search_fields = ["remote_job_id", "fine_tuned_model", "model", "base_url"]
    raw_id_fields = ["dataset_version", "validation_version", "created_by"]
    inlines = [TrainingEventInline]

    def get_readonly_fields(self, request, obj=None):
        # A job is a record of what was sent: the admin shows it, the studio changes it.
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(TrainingEvent)
class TrainingEventAdmin(admin.ModelAdmin):
    list_display = ["id", "job", "time", "level", "type", "message", "step", "train_loss"]
    list_filter = ["level", "type"]
    search_fields = ["message", "remote_id"]
    raw_id_fields = ["job"]

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(LocalRun)
class LocalRunAdmin(admin.ModelAdmin):
    """A trl job's run on a train worker: shown, never edited (the worker and Cancel do that)."""

    list_display = [
        "id",
        "job",
        "status",
        "step",
        "total_steps",
        "checkpoint_step",
        "attempts",
        "fine_tuned_model",
        "heartbeat_at",
    ]
    list_filter = ["status"]
    search_fields = ["fine_tuned_model", "model_sha256"]
    raw_id_fields = ["job", "created_by"]

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(GrpoIteration)
class GrpoIterationAdmin(admin.ModelAdmin):
    """One iteration of a GRPO job: shown, never edited (the train worker writes it)."""

    list_display = [
        "id",
        "job",
        "number",
        "status",
        "batch",
        "episodes",
        "reward_mean",
        "score",
        "loss",
        "kl",
        "created_at",
    ]
    list_filter = ["status"]
    search_fields = ["reward"]
    raw_id_fields = ["job", "batch"]

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False
