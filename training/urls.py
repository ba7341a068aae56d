from django.urls import path

from training import views

app_name = "training"
urlpatterns = [
    path("", views.job_list, name="job_list"),
    path("new/", views.job_new, name="job_new"),
    path("<int:job_id>/", views.job_detail, name="job_detail"),
    path("<int:job_id>/cancel/", views.job_cancel, name="job_cancel"),
    path("<int:job_id>/refresh/", views.job_refresh, name="job_refresh"),
    path("<int:job_id>/evaluate/", views.job_evaluate, name="job_evaluate"),
    path(
        "<int:job_id>/evaluate/<int:batch_id>/base/",
        views.job_evaluate_base,
        name="job_evaluate_base",
    ),
]
