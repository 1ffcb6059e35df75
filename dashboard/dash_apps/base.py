"""The DjangoDash every page's app is: its page loads the component libraries its own layout uses, no others."""

from __future__ import annotations

from functools import partial

from django_plotly_dash import DjangoDash


def _libraries(component) -> set[str]:
    """Top-level packages of every component in a layout (how Dash's ComponentRegistry names libraries)."""
    found, stack = set(), [component]
    while stack:
        node = stack.pop()
        if isinstance(node, list | tuple):
            stack.extend(node)
        elif hasattr(node, "_namespace"):
            found.add(type(node).__module__.split(".")[0])
            stack.append(getattr(node, "children", None))
    return found


class PageDash(DjangoDash):
    """A DjangoDash whose page leaves out component libraries its layout does not use.

    Dash lists every imported component library's scripts for every app: dash-cytoscape, which only the fabric
    page draws with, was 0.5 MB fetched and ~80 ms of a cold page's script time on every other page. The renderer,
    dcc and html are always listed by Dash itself.
    """

    def form_dash_instance(self, *args, **kwargs):
        instance = super().form_dash_instance(*args, **kwargs)
        if callable(self.layout):
            return instance  # built per request: what it holds is not known here
        instance.scripts.get_all_scripts = partial(instance.scripts.get_library_scripts, _libraries(self.layout))
        return instance
