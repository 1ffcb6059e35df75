"""URL routes: operator pages, auth and the ingest API."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django_plotly_dash.views import add_stateless_apps

import dashboard.dash_apps  # noqa: F401  (registers the Dash apps before the first request)
from dashboard import openapi, views
from dashboard.pages import (
    alerts,
    anomalies,
    chargeback,
    fabric,
    facility,
    health,
    inventory,
    jobs,
    portal,
    reliability,
)
from tenancy.access import operator_required

urlpatterns = [
    path("", views.fleet, name="fleet"),
    path("racks/", views.racks, name="racks"),
    path("health/<str:kind>/<str:state>/", health.health_list, name="health-list"),
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
    path("remediation/<int:action_id>/", alerts.action_detail, name="action"),
    path("remediation/<int:action_id>/approve/", alerts.action_approve, name="action-approve"),
    path("remediation/<int:action_id>/reject/", alerts.action_reject, name="action-reject"),
    path("remediation/drain/", alerts.action_drain, name="action-drain"),
    path("audit/", alerts.audit, name="audit"),
    # The tenant portal: a tenant's own jobs, usage, costs, invoices, alerts and GPU health.
    path("portal/", portal.portal_home, name="portal-home"),
    path("portal/<slug:slug>/", portal.portal, name="portal"),
    path("portal/<slug:slug>/jobs/", portal.portal_jobs, name="portal-jobs"),
    path("portal/<slug:slug>/invoices/", portal.portal_invoices, name="portal-invoices"),
    path("portal/<slug:slug>/invoices/<str:number>.csv", portal.portal_invoice_export, {"fmt": "csv"},
         name="portal-invoice-csv"),
    path("portal/<slug:slug>/invoices/<str:number>.json", portal.portal_invoice_export, {"fmt": "json"},
         name="portal-invoice-json"),
    path("portal/<slug:slug>/invoices/<str:number>/", portal.portal_invoice, name="portal-invoice"),
    path("portal/<slug:slug>/usage.csv", portal.portal_usage_csv, name="portal-usage-csv"),
    path("portal/<slug:slug>/health/", portal.portal_health, name="portal-health"),
    # Chargeback (operators): every tenant's usage and cost, fair share, quotas, invoices and corrections.
    path("chargeback/", chargeback.chargeback, name="chargeback"),
    path("chargeback/generate/", chargeback.generate, name="chargeback-generate"),
    path("chargeback/usage.csv", chargeback.usage_export, name="chargeback-usage-csv"),
    path("chargeback/tenants/<slug:slug>/billing-mode/", chargeback.billing_mode, name="chargeback-billing-mode"),
    path("chargeback/invoices/<str:number>.csv", chargeback.invoice_export, {"fmt": "csv"},
         name="chargeback-invoice-csv"),
    path("chargeback/invoices/<str:number>.json", chargeback.invoice_export, {"fmt": "json"},
         name="chargeback-invoice-json"),
    path("chargeback/invoices/<str:number>/", chargeback.invoice_detail, name="chargeback-invoice"),
    path("chargeback/invoices/<str:number>/finalize/", chargeback.finalize, name="chargeback-finalize"),
    path("chargeback/lines/<int:line_id>/correct/", chargeback.correct_line, name="chargeback-correct"),
    path("login/", views.RoleLoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("telemetry.api.urls")),
    path("api/v1/", include("alerts.api.urls")),
    # The API's OpenAPI document (docs/openapi.yaml), as written and as JSON.
    path("api/v1/openapi.yaml", openapi.openapi_yaml, name="api-openapi-yaml"),
    path("api/v1/openapi.json", openapi.openapi_json, name="api-openapi-json"),
    path("", include("tenancy.urls")),  # single sign-on (/oidc/…) when configured
    # django-plotly-dash's admin helper writes app rows: operators only (the library leaves it open to anyone).
    path("django_plotly_dash/add_stateless_apps", operator_required(add_stateless_apps)),
    path("django_plotly_dash/", include("django_plotly_dash.urls")),
]
