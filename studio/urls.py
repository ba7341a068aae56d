from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

admin.site.site_header = "Crafter VLM Studio administration"
admin.site.site_title = "Crafter VLM Studio admin"
admin.site.index_title = "Studio data"

urlpatterns = [
    path("", RedirectView.as_view(url="/rollouts/", permanent=False)),
    # Browsers ask for it on every site, logged in or not.
    path(
        "favicon.ico",
        login_not_required(RedirectView.as_view(url=static("studio/favicon.svg"), permanent=True)),
    ),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("", include("rollouts.urls")),
    path("datasets/", include("curation.urls")),
    # A training job's pages and the Evaluate pages the evaluation app adds to them, in one
    # namespace (`training:job_detail`, `training:job_evaluate`): training names no later app.
    path(
        "training/",
        include(
            (
                [path("", include("training.urls")), path("", include("evaluation.job_urls"))],
                "training",
            )
        ),
    ),
    path("", include("evaluation.urls")),
    path("probes/", include("probes.urls")),
]
