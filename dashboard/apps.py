from django.apps import AppConfig


class DashboardConfig(AppConfig):
    """Pages, live consumers and Dash apps."""

    name = "dashboard"

    def ready(self) -> None:
        # Registers the system check that the pinned plotly.js was fetched (`manage.py check`, collectstatic).
        from dashboard import staticfiles  # noqa: F401
