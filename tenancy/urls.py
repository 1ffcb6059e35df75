"""Routes of the tenancy app that sit outside the portal: single sign-on, when it is configured."""

from django.conf import settings
from django.urls import include, path

# /oidc/authenticate/ (start a login at the provider), /oidc/callback/, /oidc/logout/.
urlpatterns = [path("oidc/", include("mozilla_django_oidc.urls"))] if settings.OIDC_ENABLED else []
