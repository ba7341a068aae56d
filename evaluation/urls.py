from django.urls import path

from evaluation import views

app_name = "evaluation"
urlpatterns = [
    path("compare/", views.compare, name="compare"),
    path("compare/seed/<int:seed>/", views.compare_seed, name="compare_seed"),
    path("leaderboard/", views.leaderboard, name="leaderboard"),
]
