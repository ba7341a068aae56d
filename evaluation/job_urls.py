"""Evaluate's addresses on a training job's page (`/training/<id>/evaluate/...`).

The project's URLs (`studio/urls.py`) mount these beside `training/urls.py`'s, in the
`training:` namespace (`training:job_evaluate`): the training app never names evaluation,
which builds on it.
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
