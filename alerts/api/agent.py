"""The node agent's command channel."""

from django.http import JsonResponse


def _todo(request, **kwargs):
    return JsonResponse({"error": {"code": "not_implemented", "message": "not built yet"}}, status=501)


poll_commands = _todo
command_result = _todo
