from django.urls import path

app_name = "datasets"
urlpatterns: list = []
