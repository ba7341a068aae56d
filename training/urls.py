from django.urls import path

from training import views

# Mounted by the project's URLs as `training:`, beside the pages other apps add to a training
# job's (the evaluation app's Evaluate): no `app_name` here, the namespace is the mount's.
urlpatterns = [
    path("", views.job_list, name="job_list"),
    path("new/", views.job_new, name="job_new"),
    path("<int:job_id>/", views.job_detail, name="job_detail"),
    path("<int:job_id>/cancel/", views.job_cancel, name="job_cancel"),
    path("<int:job_id>/refresh/", views.job_refresh, name="job_refresh"),
]
