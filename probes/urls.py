from django.urls import path

from probes import views

app_name = "probes"
urlpatterns = [
    path("", views.probe_list, name="probe_list"),
    path("sets/new/", views.set_create, name="set_create"),
    path("sets/<int:set_id>/", views.set_detail, name="set_detail"),
    path("sets/<int:set_id>/runs/new/", views.run_create, name="run_create"),
    path("runs/<int:run_id>/", views.run_detail, name="run_detail"),
    path("runs/<int:run_id>/resume/", views.run_resume, name="run_resume"),
    path("runs/<int:run_id>/cancel/", views.run_cancel, name="run_cancel"),
    path("answers/<int:answer_id>/flag/", views.answer_flag, name="answer_flag"),
    path("answers/<int:answer_id>/note/", views.answer_note, name="answer_note"),
    path("compare/", views.compare, name="compare"),
    path("leaderboard/", views.leaderboard, name="leaderboard"),
]
