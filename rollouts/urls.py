from django.urls import path

from rollouts import views

app_name = "rollouts"
urlpatterns = [
    path("rollouts/", views.batch_list, name="batch_list"),
    path("frames/<str:sha256>.png", views.frame_image, name="frame_image"),
]
