from django.urls import path

from curation import views

app_name = "datasets"
urlpatterns = [
    path("", views.dataset_list, name="dataset_list"),
    path("new/", views.dataset_new, name="dataset_new"),
    path("import/", views.dataset_import, name="dataset_import"),
    path("imports/<int:import_id>/", views.import_detail, name="import_detail"),
    path("counts/", views.dataset_counts, name="dataset_counts"),
    path("<int:dataset_id>/", views.dataset_detail, name="dataset_detail"),
    path("<int:dataset_id>/versions/", views.dataset_versions, name="dataset_versions"),
    path("<int:dataset_id>/export/", views.version_create, name="version_create"),
    path("versions/<int:version_id>/download/", views.version_download, name="version_download"),
]
