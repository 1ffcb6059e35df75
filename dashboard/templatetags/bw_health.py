"""`{% health_badge row %}`: the one way a page shows an entity's state from `telemetry.health`.

`row` is any dict with the keys `telemetry.selectors.inventory.health_fields` gives (health,
health_colour, health_label, health_detail). The badge carries `data-health`, so tests, the tour
bench and the live pages' scripts read the state the same way on every page.
"""

from django import template
from django.utils.html import format_html

from telemetry.health import age_text
from telemetry.models import HealthState

register = template.Library()


@register.simple_tag
def health_badge(row, detail: bool = True):
    state = row.get("health") if isinstance(row, dict) else getattr(row, "state", None)
    if not state:
        return ""
    label = row.get("health_label") or HealthState(state).label
    colour = row.get("health_colour") or HealthState.colour(state)
    why = row.get("health_detail") or ""
    badge = format_html('<span class="bw-badge" data-health="{}" style="--badge: {}" title="{}">{}</span>',
                        state, colour, why, label)
    if detail and why:
        return format_html('{} <span class="bw-health-detail">{}</span>', badge, why)
    return badge


@register.filter
def data_age(age_s) -> str:
    """How old an entity's newest sample is, as the health model says it ("no data for 8 min")."""
    return age_text(age_s)
