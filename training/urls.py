app_name = "training"
urlpatterns: list = []
