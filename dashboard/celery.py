"""The Celery app; tasks are discovered in each app's tasks.py."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

app = Celery("breakwater")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
