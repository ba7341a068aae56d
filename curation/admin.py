from django.contrib import admin

from curation.models import Dataset, DatasetImport, DatasetVersion


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "created_by", "created_at", "updated_at"]
    search_fields = ["name", "description"]
    readonly_fields = ["created_at", "updated_at"]


@admin.register(DatasetVersion)
class DatasetVersionAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "dataset",
        "number",
        "status",
        "rows",
        "episodes",
        "images",
        "sha256",
        "created_by",
        "created_at",
    ]
    list_filter = ["status"]
    search_fields = ["dataset__name", "sha256"]
    raw_id_fields = ["dataset"]

    def get_readonly_fields(self, request, obj=None):
        # Versions are records of what was exported: everything is read-only here.
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(DatasetImport)
class DatasetImportAdmin(admin.ModelAdmin):
    list_display = ["id", "original_name", "status", "phase", "dataset", "created_by", "created_at"]
    list_filter = ["status"]
    search_fields = ["original_name", "name"]
    raw_id_fields = ["dataset"]

    def get_readonly_fields(self, request, obj=None):
        # The worker owns these rows (claims, progress); the admin only looks.
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False
