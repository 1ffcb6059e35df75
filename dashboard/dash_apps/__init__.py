"""Dash apps embedded in the operator pages (django-plotly-dash, `{% plotly_direct %}`).

Importing this package registers every app by name; `dashboard.urls` imports it so the apps
exist before the first request. Callbacks only parse input, call one selector and return data:
figures are built in the browser (`static/breakwater/*.js`) from compact payloads, which keeps
16k-GPU pages small, and live changes arrive over our own websocket consumers, set into a
`dcc.Store` with `dash_clientside.set_props` (django-plotly-dash's own pipe does not work with
Channels 4).
"""

from dashboard.dash_apps import heatmap  # noqa: F401  (registers the app)
