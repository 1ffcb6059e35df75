"""URL routes: operator pages, auth and the ingest API."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

import dashboard.dash_apps  # noqa: F401  (registers the Dash apps before the first request)
from dashboard import views
from dashboard.pages import anomalies, fabric, facility, inventory, jobs, reliability

urlpatterns = [
    path("", views.fleet, name="fleet"),
    path("racks/", views.racks, name="racks"),
    path("nvlink/", facility.nvlink, name="nvlink"),
    path("fabric/", fabric.fabric, name="fabric"),
    path("power/", facility.power, name="power"),
    path("jobs/", jobs.job_list, name="jobs"),
    # A job's key is "<source>:<scheduler id>" (slurm:1234, k8s:<pod uid>).
    path("jobs/<str:key>/", jobs.job_detail, name="job"),
    path("gpus/<str:uuid>/", inventory.gpu_detail, name="gpu"),
    path("nodes/<str:hostname>/", inventory.node_detail, name="node"),
    path("ports/<int:port_id>/", inventory.port_detail, name="port"),
    path("search/", inventory.search, name="search"),
    path("anomalies/", anomalies.anomaly_list, name="anomalies"),
    path("reliability/", reliability.reliability, name="reliability"),
    path("login/", auth_views.LoginView.as_view(template_name="login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("telemetry.api.urls")),
    path("api/v1/", include("alerts.api.urls")),
    path("django_plotly_dash/", include("django_plotly_dash.urls")),
]
