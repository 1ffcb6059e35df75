"""API routes of the alerts app, mounted under /api/v1/."""

from django.urls import path

from alerts.api import agent, inbound, views

urlpatterns = [
    # Prometheus Alertmanager's webhook receiver (bring a site's existing alerts in).
    path("alerts/alertmanager", inbound.alertmanager_webhook, name="api-alertmanager"),
    # The node agent's command channel: poll for commands, post results (collector token).
    path("agent/commands", agent.poll_commands, name="api-agent-commands"),
    path("agent/commands/<int:command_id>/result", agent.command_result, name="api-agent-command-result"),
    # Operator API (session or operator credentials).
    path("alerts", views.alert_list, name="api-alerts"),
    path("alerts/<int:alert_id>", views.alert_detail, name="api-alert"),
    path("alerts/<int:alert_id>/ack", views.alert_ack, name="api-alert-ack"),
    path("rules", views.rule_list, name="api-rules"),
    path("rules/<int:rule_id>", views.rule_detail, name="api-rule"),
    path("silences", views.silence_list, name="api-silences"),
    path("silences/<int:silence_id>", views.silence_detail, name="api-silence"),
    path("channels", views.channel_list, name="api-channels"),
    path("channels/<int:channel_id>/test", views.channel_test, name="api-channel-test"),
    path("remediation/actions", views.action_list, name="api-actions"),
    path("remediation/actions/<int:action_id>/approve", views.action_approve, name="api-action-approve"),
    path("remediation/actions/<int:action_id>/impact", views.action_impact, name="api-action-impact"),
    path("remediation/actions/<int:action_id>/reject", views.action_reject, name="api-action-reject"),
    path("audit", views.audit_list, name="api-audit"),
]
