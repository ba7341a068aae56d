from django.urls import include, path

from training import views

app_name = "training"
urlpatterns = [
    path("", views.job_list, name="job_list"),
    path("new/", views.job_new, name="job_new"),
    path("<int:job_id>/", views.job_detail, name="job_detail"),
    path("<int:job_id>/cancel/", views.job_cancel, name="job_cancel"),
    path("<int:job_id>/refresh/", views.job_refresh, name="job_refresh"),
    # Evaluate (the evaluation app's pages), in this namespace: `training:job_evaluate`.
    path("", include("evaluation.job_urls")),
]
