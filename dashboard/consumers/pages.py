"""The live regions of server-rendered pages: alerts, one alert, remediation, node, GPU, port, a tenant's portal.

A page subscribes after each (re)connect with its own address (location.pathname + location.search):

    {"subscribe": "page", "sub": 1, "path": "/nodes/gpu-0001/"}

and gets at once every region as the page's view renders it now, then, whenever a group of that page
(`dashboard.live_regions.LIVE_PAGES`: alert changes, remediation changes, the ingest tick) says something
changed, only the regions whose HTML changed:

    {"type": "regions", "sub": 1, "seq": 3, "regions": {"name": "<html>", ...}}

live.js morphs each into the page in place (patch.js). A page that is not live, or that this user may not
see, is answered {"type": "error", "sub", "status", "message"} and nothing more; a socket whose user the page
would send to the login page is closed with 4401. Renders are paced: at most one a second per socket, and
less often when they cost more (LiveConsumer); one user's tabs on one page share a render per change.
"""

from __future__ import annotations

import time

from channels.db import database_sync_to_async
from django.conf import settings

from dashboard.consumers.base import CLOSE_FORBIDDEN, CLOSE_UNAUTHENTICATED, LiveConsumer, TickMemo
from dashboard.live_regions import PageRef, Refused, comparable, page_ref, render_regions
from tenancy.access import has_any_role

_shared = TickMemo()


class PageConsumer(LiveConsumer):
    """Pushes the changed live regions of the page the socket subscribed to; see the module docstring."""

    bw_access = "tenant"  # signed in with any role; each page's view decides what its user sees
    pace_memo = _shared
    live_groups = ()  # joined per subscription: the page's own groups
    MIN_INTERVAL_S = 1.0

    async def admit(self) -> bool:
        user = self.scope["user"]
        if not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return False
        if not await database_sync_to_async(has_any_role)(user):
            await self.close(code=CLOSE_FORBIDDEN)
            return False
        return True

    async def connect(self) -> None:
        self.sub: dict | None = None
        self.seq = 0
        await super().connect()

    async def receive_json(self, content, **kwargs) -> None:
        if not isinstance(content, dict) or content.get("subscribe") != "page":
            await self.send_json({"type": "error", "status": 400, "message": 'expected {"subscribe": "page", ...}'})
            return
        sub_id = content.get("sub", 0)
        try:
            ref = page_ref(content.get("path"))
        except Refused as exc:
            await self._refuse(sub_id, exc)
            return
        await self._join_only(ref.groups)
        # A new dict per subscription: a pass still rendering the old one sees it is stale.
        self.sub = {"sub": sub_id, "ref": ref, "sent": {}}
        self.tick = None  # a fresh render, not the last change's
        self.refresh()

    async def live_changed(self, event: dict) -> None:
        """An alert or remediation change (alerts.live): paced like a telemetry tick."""
        await self.telemetry_tick(event)

    def pace_wait(self) -> float:
        return max(super().pace_wait(), self._last_pass + self.MIN_INTERVAL_S - time.monotonic())

    async def push(self) -> None:
        sub = self.sub
        if sub is None:
            return
        try:
            regions = await _shared.run(self._render, sub["ref"], self.tick)
        except Refused as exc:
            if sub is self.sub:
                await self._refuse(sub["sub"], exc)
            return
        if sub is not self.sub:
            return  # the page subscribed anew while we rendered: its own refresh follows
        sent = sub["sent"]
        changed = {name: html for name, html in regions.items() if sent.get(name) != comparable(html)}
        if sent and not changed:
            return
        sent.update({name: comparable(html) for name, html in changed.items()})
        self.seq += 1
        await self.send_json({"type": "regions", "sub": sub["sub"], "seq": self.seq, "regions": changed})

    def _render(self, ref: PageRef, tick: str | None) -> dict[str, str]:
        # Shared only by the same user on the same page with the same CSRF secret: what one render shows.
        cookie = self.scope.get("cookies", {}).get(settings.CSRF_COOKIE_NAME, "")
        key = ("page", ref.path, ref.query, self.scope["user"].pk, cookie)
        return _shared.get(key, tick, render_regions, ref, self.scope)

    async def _refuse(self, sub_id, exc: Refused) -> None:
        self.sub = None
        await self._join_only(())
        if exc.close is not None:
            await self.close(code=exc.close)
            return
        await self.send_json({"type": "error", "sub": sub_id, "status": exc.status, "message": str(exc)})

    async def _join_only(self, groups: tuple[str, ...]) -> None:
        for group in self._groups - set(groups):
            await self.leave(group)
        for group in set(groups) - self._groups:
            await self.join(group)
