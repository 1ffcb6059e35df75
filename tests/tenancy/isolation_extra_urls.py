"""The project's URLs plus two endpoints the isolation matrix must refuse to pass over (its self-test): one
with a parameter its registry cannot fill, one whose view declares no access rule."""

from django.http import HttpResponse
from django.urls import include, path

from tenancy.access import tenant_member_required


@tenant_member_required
def widget(request, slug: str, widget_id: int):
    """A tenant page with a parameter nobody registered."""
    return HttpResponse("widget")


def unmarked_report(request):
    """A page with no access decorator at all."""
    return HttpResponse("everything")


urlpatterns = [
    path("", include("dashboard.urls")),
    path("portal/<slug:slug>/widgets/<int:widget_id>/", widget, name="widget"),
    path("reports/everything/", unmarked_report, name="unmarked-report"),
]
