"""The Django project: settings, urls, ASGI app, Celery app and the operator UI."""

from .celery import app as celery_app

__all__ = ["celery_app"]
