"""Dash apps embedded in the operator pages (django-plotly-dash, `{% plotly_direct %}`).

Importing this package registers every app by name; `dashboard.urls` imports it so the apps
exist before the first request. Callbacks only parse input, call one selector and return data:
figures are built from compact payloads (in the browser where the page is large, as for the
16k-GPU heatmap), and live changes arrive over our own websocket consumers, set into a
`dcc.Store` with `dash_clientside.set_props` (django-plotly-dash's own pipe does not work with
Channels 4).
"""

from dashboard.dash_apps import fabric, facility, heatmap, inventory, jobs  # noqa: F401  (registers the apps)
