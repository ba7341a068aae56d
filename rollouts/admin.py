from django.contrib import admin

from rollouts.models import Episode, Frame, RolloutBatch, Turn, TurnRelabel


@admin.register(RolloutBatch)
class RolloutBatchAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "name",
        "policy",
        "model",
        "status",
        "episodes_total",
        "episodes_finished",
        "episodes_failed",
        "created_by",
        "created_at",
    ]
    list_filter = ["status", "policy", "model"]
    search_fields = ["name", "model", "endpoint", "endpoint_name"]
    readonly_fields = ["created_at", "started_at", "finished_at"]


@admin.register(Episode)
class EpisodeAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "batch",
        "seed",
        "sample",
        "status",
        "steps",
        "total_reward",
        "rl_reward",  # a reinforcement-learning run's chosen reward; empty for any other
        "achievement_count",
        "attempts",
    ]
    list_filter = ["status", "batch__policy"]
    search_fields = ["batch__name", "seed"]
    raw_id_fields = ["batch", "forked_from"]


@admin.register(Frame)
class FrameAdmin(admin.ModelAdmin):
    list_display = ["id", "episode", "step", "sha256", "width", "height"]
    search_fields = ["sha256"]
    raw_id_fields = ["episode"]


@admin.register(Turn)
class TurnAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "episode",
        "index",
        "actions",
        "reward",
        "advantage",  # a reinforcement-learning run's; empty for any other turn
        "flagged",
        "error_kind",
    ]
    list_filter = ["flagged", "error_kind", "text_fallback"]
    search_fields = ["note", "model_text"]
    raw_id_fields = ["episode", "frame", "reviewed_by"]


@admin.register(TurnRelabel)
class TurnRelabelAdmin(admin.ModelAdmin):
    list_display = ["id", "turn", "actions", "labeled_by", "labeled_at"]
    search_fields = ["reason"]
    raw_id_fields = ["turn", "labeled_by"]
