from django.contrib import admin

from probes.models import ProbeAnswer, ProbeQuestion, ProbeRun, ProbeRunChunk, ProbeSet


class _GeneratedAdmin(admin.ModelAdmin):
    """Rows a command or a worker writes: the admin looks, and may delete, never edits."""

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(ProbeSet)
class ProbeSetAdmin(_GeneratedAdmin):
    list_display = [
        "id",
        "name",
        "seed",
        "questions_count",
        "frames_count",
        "episodes_count",
        "balanced",
        "created_by",
        "created_at",
    ]
    list_filter = ["balanced"]
    search_fields = ["name"]

    def get_readonly_fields(self, request, obj=None):
        # The questions were made from these values: only the name may change.
        return [f.name for f in self.model._meta.fields if f.name != "name"]


@admin.register(ProbeQuestion)
class ProbeQuestionAdmin(_GeneratedAdmin):
    list_display = ["id", "probe_set", "index", "kind", "subject", "answer", "frame"]
    list_filter = ["kind"]
    search_fields = ["text"]
    raw_id_fields = ["probe_set", "frame", "turn", "episode"]
    list_select_related = ["probe_set"]


@admin.register(ProbeRun)
class ProbeRunAdmin(_GeneratedAdmin):
    list_display = [
        "id",
        "probe_set",
        "model",
        "endpoint_name",
        "observation",
        "status",
        "answered",
        "correct",
        "errors",
        "created_at",
    ]
    list_filter = ["status", "observation"]
    search_fields = ["model", "endpoint_name"]
    raw_id_fields = ["probe_set", "created_by"]
    list_select_related = ["probe_set"]


@admin.register(ProbeRunChunk)
class ProbeRunChunkAdmin(_GeneratedAdmin):
    list_display = ["id", "run", "index", "first", "last", "status", "heartbeat_at"]
    list_filter = ["status"]
    raw_id_fields = ["run", "created_by"]
    list_select_related = ["run"]


@admin.register(ProbeAnswer)
class ProbeAnswerAdmin(_GeneratedAdmin):
    list_display = ["id", "run", "question", "choice", "correct", "error_kind", "flagged"]
    list_filter = ["correct", "flagged", "error_kind"]
    search_fields = ["model_text", "note"]
    raw_id_fields = ["run", "question"]

    def get_readonly_fields(self, request, obj=None):
        # What the model answered is a record; a reviewer's flag and note are theirs to edit.
        return [f.name for f in self.model._meta.fields if f.name not in ("flagged", "note")]
