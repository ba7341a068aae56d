from django.urls import path

from rollouts import views
from rollouts.play import views as play_views
from rollouts.review import views as review_views

app_name = "rollouts"
urlpatterns = [
    path("rollouts/", views.batch_list, name="batch_list"),
    path("rollouts/new/", views.batch_create, name="batch_create"),
    path("rollouts/new/estimate/", views.batch_estimate, name="batch_estimate"),
    path("rollouts/<int:batch_id>/", views.batch_detail, name="batch_detail"),
    path("rollouts/<int:batch_id>/resume/", views.batch_resume, name="batch_resume"),
    path("rollouts/<int:batch_id>/cancel/", views.batch_cancel, name="batch_cancel"),
    path("episodes/<int:episode_id>/", review_views.episode_detail, name="episode_detail"),
    path("episodes/<int:episode_id>/live/", review_views.episode_live, name="episode_live"),
    path(
        "episodes/<int:episode_id>/turns/<int:index>/",
        review_views.episode_turn,
        name="episode_turn",
    ),
    path("turns/", review_views.turn_list, name="turn_list"),
    path("turns/bulk-flag/", review_views.turns_bulk_flag, name="turns_bulk_flag"),
    path("turns/bulk/", review_views.turns_bulk, name="turns_bulk"),
    path(
        "turns/bulk-flag/<int:job_id>/",
        review_views.turn_bulk_flag_detail,
        name="turn_bulk_flag_detail",
    ),
    path("turns/<int:turn_id>/flag/", review_views.turn_flag, name="turn_flag"),
    path("turns/<int:turn_id>/note/", review_views.turn_note, name="turn_note"),
    path("turns/<int:turn_id>/text/<str:field>/", review_views.turn_text, name="turn_text"),
    path("turns/<int:turn_id>/relabel/", play_views.turn_relabel, name="turn_relabel"),
    path("episodes/<int:episode_id>/fork/", play_views.episode_fork, name="episode_fork"),
    path("play/new/", play_views.play_new, name="play_new"),
    path("play/<int:episode_id>/", play_views.play, name="play"),
    path("play/<int:episode_id>/step/", play_views.play_step, name="play_step"),
    path("play/<int:episode_id>/end/", play_views.play_end, name="play_end"),
    path("frames/<str:sha256>.png", views.frame_image, name="frame_image"),
]
