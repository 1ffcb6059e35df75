"""/ws/page/: a socket gets the live regions of a page only where its user may see that page.

The regions come from the page's own view, so access is the page's: a tenant's member gets its own portal's
regions and is refused another tenant's portal and every operator page; an operator gets the operator pages.
Refusals carry no region at all (the markers of the other tenant never reach the socket).
"""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync

from tests.dashboard.conftest import ws_communicator
from tests.tenancy.access_world import make_personas, make_tenant_world, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)


async def _ask(cookie: bytes | None, path: str) -> tuple[bool, object, list[dict]]:
    """Connect, subscribe to `path`, and collect what comes back (until nothing more for a moment)."""
    ws = ws_communicator("/ws/page/", cookie)
    connected, code = await ws.connect(timeout=10)
    if not connected:
        # End the application before the loop closes: left running, its cancellation at loop close once hung
        # for the whole test timeout (every other refused-socket test disconnects too).
        await ws.disconnect()
        return False, code, []
    await ws.send_json_to({"subscribe": "page", "sub": 7, "path": path})
    got = [await ws.receive_json_from(timeout=10)]
    while not await ws.receive_nothing(timeout=0.3):
        got.append(await ws.receive_json_from(timeout=5))
    await ws.disconnect()
    return True, None, got


@pytest.fixture
def world():
    acme = make_tenant_world("acme", "1001")
    globex = make_tenant_world("globex", "2002")
    personas = make_personas(acme, globex)
    cookies = {name: session_cookie(personas.clients[name]) for name in ("operator", "acme", "globex", "nobody")}
    return acme, globex, cookies


def test_tenant_socket_gets_its_own_portal_regions(world):
    acme, _, cookies = world
    connected, _, got = async_to_sync(_ask)(cookies["acme"], "/portal/acme/")
    assert connected
    assert [m["type"] for m in got] == ["regions"] and got[0]["sub"] == 7
    regions = got[0]["regions"]
    assert {"portal-cards", "portal-quota", "portal-metered", "portal-waste"} <= set(regions)
    assert 'id="bw-open-alerts-count"' in regions["portal-cards"]


@pytest.mark.parametrize("path", ["/portal/globex/", "/alerts/", "/remediation/", "/nodes/globex-node-01/"])
def test_tenant_socket_cannot_subscribe_to_another_tenant_or_operator_pages(world, path):
    acme, globex, cookies = world
    connected, _, got = async_to_sync(_ask)(cookies["acme"], path)
    assert connected
    assert [(m["type"], m["status"], m["sub"]) for m in got] == [("error", 403, 7)]
    text = json.dumps(got)
    assert not [marker for marker in globex.markers if marker in text]


def test_operator_socket_gets_operator_pages_and_not_unlisted_ones(world):
    acme, _, cookies = world
    connected, _, got = async_to_sync(_ask)(cookies["operator"], "/alerts/")
    assert connected and got[0]["type"] == "regions"
    assert f'data-id="{acme.alert.pk}"' in got[0]["regions"]["alerts-open"]
    # Pages without live regions, unknown pages and foreign addresses are refused, not rendered.
    for path, status in (("/audit/", 400), ("/no/such/page/", 404), ("//evil.example/", 400)):
        _, _, got = async_to_sync(_ask)(cookies["operator"], path)
        assert [(m["type"], m["status"]) for m in got] == [("error", status)], path


def test_sockets_without_a_role_or_session_are_refused(world):
    _, _, cookies = world
    assert async_to_sync(_ask)(None, "/portal/acme/")[:2] == (False, 4401)
    assert async_to_sync(_ask)(cookies["nobody"], "/portal/acme/")[:2] == (False, 4403)
