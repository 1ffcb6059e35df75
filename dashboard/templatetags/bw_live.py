"""{% live "name" %}…{% endlive %}: a region of a page that the server re-renders and pushes while it is open.

The region renders as <div data-live="name" style="display: contents"> around its content (no box of its own,
so wrapping changes no layout). When the page is rendered for a live push (`dashboard.live_regions`), the
request carries a sink and each region's content is also recorded there: the push sends exactly what the
page's own template rendered, so the first render and every push can never disagree.
"""

from __future__ import annotations

from django import template
from django.utils.html import format_html
from django.utils.safestring import mark_safe

register = template.Library()

SINK = "_bw_live_regions"  # the request attribute a live render collects regions in


class LiveNode(template.Node):
    def __init__(self, name: template.base.FilterExpression, nodelist: template.NodeList):
        self.name, self.nodelist = name, nodelist

    def render(self, context) -> str:
        name = str(self.name.resolve(context))
        inner = self.nodelist.render(context)
        sink = getattr(context.get("request"), SINK, None)
        if sink is not None:
            sink[name] = inner
        return format_html('<div data-live="{}" style="display: contents">{}</div>', name, mark_safe(inner))


@register.tag("live")
def live(parser, token) -> LiveNode:
    bits = token.split_contents()
    if len(bits) != 2:
        raise template.TemplateSyntaxError('usage: {% live "region-name" %}…{% endlive %}')
    nodelist = parser.parse(("endlive",))
    parser.delete_first_token()
    return LiveNode(parser.compile_filter(bits[1]), nodelist)
