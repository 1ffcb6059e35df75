"""URL routes: operator pages, auth and the ingest API."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

import dashboard.dash_apps  # noqa: F401  (registers the Dash apps before the first request)
from dashboard import views

urlpatterns = [
    path("", views.fleet, name="fleet"),
    path("racks/", views.racks, name="racks"),
    path("login/", auth_views.LoginView.as_view(template_name="login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("telemetry.api.urls")),
    path("django_plotly_dash/", include("django_plotly_dash.urls")),
]
