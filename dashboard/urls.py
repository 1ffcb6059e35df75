"""URL routes: operator pages, auth and the ingest API."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

import dashboard.dash_apps  # noqa: F401  (registers the Dash apps before the first request)
from dashboard import views
from dashboard.pages import alerts, anomalies, fabric, facility, inventory, jobs, reliability

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
    # Alerting: alerts and their history, rules, silences, routing, channels; remediation; the audit log.
    path("alerts/", alerts.alert_list, name="alerts"),
    path("alerts/<int:alert_id>/", alerts.alert_detail, name="alert"),
    path("alerts/<int:alert_id>/ack/", alerts.alert_ack, name="alert-ack"),
    path("alerts/rules/", alerts.rule_list, name="alert-rules"),
    path("alerts/rules/<int:rule_id>/", alerts.rule_edit, name="alert-rule"),
    path("alerts/rules/<int:rule_id>/enabled/", alerts.rule_enabled, name="alert-rule-enabled"),
    path("alerts/rules/<int:rule_id>/delete/", alerts.rule_delete, name="alert-rule-delete"),
    path("alerts/silences/", alerts.silence_list, name="silences"),
    path("alerts/silences/<int:silence_id>/expire/", alerts.silence_expire, name="silence-expire"),
    path("alerts/routing/", alerts.routing, name="routing"),
    path("alerts/channels/", alerts.channel_list, name="channels"),
    path("alerts/channels/<int:channel_id>/test/", alerts.channel_test, name="channel-test"),
    path("alerts/channels/<int:channel_id>/enable/", alerts.channel_enable, name="channel-enable"),
    path("alerts/notifications/<int:notification_id>/", alerts.notification_detail, name="notification"),
    path("remediation/", alerts.remediation, name="remediation"),
    path("remediation/<int:action_id>/approve/", alerts.action_approve, name="action-approve"),
    path("remediation/<int:action_id>/reject/", alerts.action_reject, name="action-reject"),
    path("remediation/drain/", alerts.action_drain, name="action-drain"),
    path("audit/", alerts.audit, name="audit"),
    path("login/", auth_views.LoginView.as_view(template_name="login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("telemetry.api.urls")),
    path("api/v1/", include("alerts.api.urls")),
    path("django_plotly_dash/", include("django_plotly_dash.urls")),
]
