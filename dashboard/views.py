"""Operator pages: each renders a template; the Dash apps inside load their own data."""

from django.conf import settings
from django.contrib import admin
from django.contrib.auth.views import LoginView
from django.shortcuts import render

from alerts.selectors import open_alert_counts
from dashboard.security import LockoutAdminAuthenticationForm, LockoutAuthenticationForm
from telemetry import selectors
from tenancy.access import PORTAL_URL, operator_required
from tenancy.scoping import is_operator

# The admin's sign-in gets the console's lockout: it is the other password form on the site. Set here
# because the URLconf (which mounts admin.site) imports this module before any request is served.
admin.site.login_form = LockoutAdminAuthenticationForm


@operator_required
def fleet(request):
    """The first page: fleet health, utilization, power and data freshness, kept live by JS."""
    return render(request, "fleet.html", {"summary": fleet_page_summary()})


def fleet_page_summary() -> dict:
    """The fleet summary with the open alerts' counts: the same query as the alerts list's header."""
    return {**selectors.fleet_summary(), "alerts": open_alert_counts()}


@operator_required
def racks(request):
    """The rack heatmap (Dash app `heatmap`)."""
    return render(request, "racks.html")


class RoleLoginView(LoginView):
    """The sign-in form; without a `next`, operators land on the fleet and tenants' users on their portal."""

    template_name = "login.html"
    form_class = LockoutAuthenticationForm

    def get_default_redirect_url(self):
        return super().get_default_redirect_url() if is_operator(self.request.user) else PORTAL_URL

    def get_context_data(self, **kwargs):
        return {**super().get_context_data(**kwargs), "oidc_enabled": settings.OIDC_ENABLED}
