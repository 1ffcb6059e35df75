"""Inbound alerts: Prometheus Alertmanager webhook payloads."""

from django.http import JsonResponse


def _todo(request, **kwargs):
    return JsonResponse({"error": {"code": "not_implemented", "message": "not built yet"}}, status=501)


alertmanager_webhook = _todo
