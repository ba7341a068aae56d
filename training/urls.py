from django.urls import path

app_name = "training"
urlpatterns: list = []
