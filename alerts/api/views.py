"""Operator API for alerts, rules, silences, channels, remediation and audit."""

from django.http import JsonResponse


def _todo(request, **kwargs):
    return JsonResponse({"error": {"code": "not_implemented", "message": "not built yet"}}, status=501)


alert_list = _todo
alert_detail = _todo
alert_ack = _todo
rule_list = _todo
rule_detail = _todo
silence_list = _todo
silence_detail = _todo
channel_list = _todo
channel_test = _todo
action_list = _todo
action_approve = _todo
action_reject = _todo
audit_list = _todo
