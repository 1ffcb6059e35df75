"""The project's URLs plus mozilla-django-oidc's (which tenancy.urls adds only when OIDC is configured by
environment at start-up; the SSO tests configure it per test)."""

from django.urls import include, path

urlpatterns = [
    path("", include("dashboard.urls")),
    path("oidc/", include("mozilla_django_oidc.urls")),
]
