"""Evaluate's addresses on a training job's page (`/training/<id>/evaluate/...`).

`training/urls.py` mounts these in its own namespace (`training:job_evaluate`), by name: the
training app never imports evaluation, which builds on it.
"""

from django.urls import path

from evaluation import views

urlpatterns = [
    path("<int:job_id>/evaluate/", views.job_evaluate, name="job_evaluate"),
    path(
        "<int:job_id>/evaluate/<int:batch_id>/base/",
        views.job_evaluate_base,
        name="job_evaluate_base",
    ),
]
