"""A URLconf with one view that fails the way a driver does: its message and its locals hold a URL with a password."""

from django.conf import settings
from django.urls import path


def broker_down(request):
    broker = settings.CELERY_BROKER_URL  # a local of the failing frame, as an error report shows it
    raise ConnectionError(f"cannot reach the broker at {broker}")


urlpatterns = [path("broker-down/", broker_down)]
