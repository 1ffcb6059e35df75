"""Several processes at once: two daphne servers and two Celery workers on one database and one Redis.

Production scales out by running more of the same processes (docs: ARCHITECTURE "Principles"); these tests
check the three things that must not change when it does: a live page sees data whatever server ingested
it, a fault posted twice (to both servers) and evaluated by both workers pages once, and rollups filled by
two workers at once equal a single-process recomputation from the raw rows.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
import requests
import websocket
from django.conf import settings
from django.db import connection

from alerts import tasks as alert_tasks
from alerts.actions import clear_evaluation_flag
from alerts.models import Alert, AlertEvent, Channel, Notification, NotificationStatus, Route, Rule, RuleKind
from alerts.receiver import Receiver
from dashboard.celery import app
from telemetry import tasks as telemetry_tasks
from telemetry.actions import do_create_collector_token
from telemetry.models import RollupWatermark
from telemetry.rollups import ROLLUPS, run_rollups
from tests.alerts.test_transports import ROUTING_KEY
from tests.conftest import _wait_for_backends_to_exit
from tests.reliability import procs
from tests.telemetry.factories import fill_gpu_fleet

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def cluster(django_db_setup, django_db_blocker):
    """Two daphne servers and two workers, started once for this module (the tests use distinct entity names:
    each server caches inventory ids per process across the tests' database flushes)."""
    env = procs.child_env(OUTBOUND_URL_ALLOWLIST="127.0.0.1")  # the local PagerDuty stand-in, on any port
    servers = [procs.Server(env), procs.Server(env)]
    workers = [procs.Worker(env, "a"), procs.Worker(env, "b")]
    app.control.purge()  # leftovers of an earlier run must not run against this database
    try:
        procs.start_all(servers, workers)
        for s in servers:  # the first request loads the URLconf and the Dash apps: not part of any test
            requests.get(f"{s.url}/api/v1/ingest", timeout=60)
        yield servers, workers
    finally:
        procs.stop_all([*workers, *servers])
        _wait_for_backends_to_exit(settings.DATABASES["default"]["NAME"], django_db_blocker)


@pytest.fixture(autouse=True)
def _allow_flush():
    """The audit log refuses TRUNCATE (alerts migration 0003) unless the session allows it: the flush after a
    transactional test runs on this connection."""
    yield
    with connection.cursor() as cur:
        cur.execute("SET breakwater.allow_truncate = 'on'")


@pytest.fixture
def receiver():
    """A local PagerDuty stand-in (alerts.receiver) on a free loopback port."""
    with Receiver() as rec:
        yield rec


def post_batch(server: procs.Server, token: str, gpus: list[dict]) -> dict:
    resp = requests.post(f"{server.url}/api/v1/ingest", data=json.dumps({"gpus": gpus}), timeout=30,
                         headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    assert resp.status_code == 200, resp.text
    return resp.json()


# --- Live pages ---------------------------------------------------------------------------------------------

def _fleet_socket(server: procs.Server, cookie: str) -> websocket.WebSocket:
    ws = websocket.create_connection(f"ws://127.0.0.1:{server.port}/ws/fleet/", cookie=cookie,
                                     origin=server.url, timeout=10)
    json.loads(ws.recv())  # the summary sent on connect
    return ws


def _next_summary_where(ws: websocket.WebSocket, predicate, timeout: float = 10.0) -> dict:
    """The first pushed fleet summary that satisfies `predicate` (earlier pushes may predate our ingest)."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        ws.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            opcode, data = ws.recv_data()
        except websocket.WebSocketTimeoutException:
            break
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            code = int.from_bytes(data[:2], "big") if len(data) >= 2 else None
            pytest.fail(f"the server closed the page's socket (code {code}); (gpus, util) pushed before: {seen}")
        summary = json.loads(data)
        if predicate(summary):
            return summary
        seen.append((summary["gpus"]["total"], summary["utilization"]["gpu_util_pct"]))
    pytest.fail(f"no matching summary within {timeout:.0f} s; (gpus, util) pushed: {seen}")


def test_data_ingested_through_one_server_reaches_pages_open_on_both(cluster, client, django_user_model):
    (one, two), _ = cluster
    token = do_create_collector_token("mp-live")
    client.force_login(django_user_model.objects.create_user("mp-operator", password="pw-mp-operator-1",
                                                             is_staff=True))
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    sockets = [_fleet_socket(one, cookie), _fleet_socket(two, cookie)]
    try:
        for server, util in ((two, 37.0), (one, 64.0)):
            now = datetime.now(UTC)
            post_batch(server, token, [{"host": "node-mp-live", "uuid": "GPU-MP-LIVE", "index": 0,
                                        "time": now.isoformat(), "fields": {"gpu_util": util}}])
            for ws in sockets:
                summary = _next_summary_where(ws, lambda s, u=util: s["utilization"]["gpu_util_pct"] == u)
                assert summary["gpus"]["total"] == 1
    finally:
        for ws in sockets:
            ws.close()


# --- Alerts -------------------------------------------------------------------------------------------------

def test_xid79_posted_to_both_servers_pages_once(cluster, receiver):
    servers, workers = cluster
    token = do_create_collector_token("mp-alerts")
    rule = Rule.objects.create(name="Xid79MP", kind=RuleKind.XID, xid_codes=[79], severity="critical")
    channel = Channel.objects.create(name="pd-mp", kind="pagerduty", config={"url": receiver.url("/pagerduty")},
                                     secret=ROUTING_KEY)
    root = Route.objects.create(name="root-mp", group_by=["alertname"], group_wait_s=0, group_interval_s=300,
                                repeat_interval_s=3600)
    root.channels.set([channel])
    clear_evaluation_flag()
    sample = [{"host": "node-mp-xid", "uuid": "GPU-MP-XID", "index": 0, "time": datetime.now(UTC).isoformat(),
               "fields": {"xid": 79, "gpu_temp": 61.0}}]

    # The same batch through both servers at once (an agent retrying on the other server after a timeout):
    # two ingest commits, each triggering evaluation; and beat's backstop evaluations and flushes on top,
    # queued together so both workers run them side by side.
    start = threading.Barrier(len(servers))
    posts = [threading.Thread(target=lambda s=s: (start.wait(), post_batch(s, token, sample))) for s in servers]
    for t in posts:
        t.start()
    for t in posts:
        t.join()
    for _ in range(3):
        alert_tasks.evaluate.delay()
        alert_tasks.flush_groups.delay()
    try:
        receiver.wait_for(1, timeout=30)
    except TimeoutError:
        pytest.fail(f"no page within 30 s: {_alert_state()}")
    procs.wait_idle(workers)
    for _ in range(2):  # a later round finds nothing new to send
        alert_tasks.evaluate.delay()
        alert_tasks.flush_groups.delay()
        alert_tasks.sweep_outbox.delay()
    procs.wait_idle(workers)

    [alert] = Alert.objects.filter(rule=rule)
    assert (alert.state, alert.entity_key, alert.labels["xid"]) == ("firing", "GPU-MP-XID", "79")
    assert AlertEvent.objects.filter(alert=alert, kind="fired").count() == 1
    [note] = Notification.objects.all()
    assert (note.status, note.event, note.attempts) == (NotificationStatus.DELIVERED, "trigger", 1)
    assert len(receiver.requests) == 1
    assert receiver.requests[0].json()["dedup_key"] == note.dedup_key
    assert receiver.incidents == {note.dedup_key: "trigger"}


def _alert_state() -> dict:
    from alerts.models import AlertGroup
    from telemetry.models import GpuEvent

    return {"events": list(GpuEvent.objects.values("code", "count")),
            "alerts": list(Alert.objects.values("state", "entity_key")),
            "groups": list(AlertGroup.objects.values("key", "next_flush_at" if False else "labels")),
            "notifications": list(Notification.objects.values("status", "attempts", "error"))}


# --- Rollups ------------------------------------------------------------------------------------------------

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
HOURS = 3
GPUS = 8
RESET_GPU, RESET_AT = 2, timedelta(minutes=47, seconds=5)


def _raw_data() -> None:
    """Three hours of every GPU field at 10 s for 8 GPUs; GPU 2's counters restart from zero at 09:47:05."""
    fill_gpu_fleet(GPUS, T0, timedelta(hours=HOURS), timedelta(seconds=10))
    with connection.cursor() as cur:
        cur.execute("UPDATE telemetry_gpu_sample SET energy_mj = extract(epoch FROM time - %s)::bigint * 3 "
                    "WHERE gpu_id = %s AND time >= %s", [T0 + RESET_AT, RESET_GPU, T0 + RESET_AT])


def _true_increase(gpu_id: int, field: str) -> float:
    """The counter's increase over the whole series, resets counted from zero, straight from the raw rows."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT {field} FROM telemetry_gpu_sample WHERE gpu_id = %s ORDER BY time", [gpu_id])
        values = [v for (v,) in cur.fetchall()]
    return float(sum(b - a if b >= a else b for a, b in zip(values, values[1:], strict=False)))


def rollup_snapshot() -> dict[str, list[tuple]]:
    """Every row of every rollup table, in key order."""
    out = {}
    with connection.cursor() as cur:
        for r in ROLLUPS:
            cur.execute(f"SELECT * FROM {r.target} ORDER BY {', '.join(r.keys)}, bucket")
            out[r.target] = cur.fetchall()
    return out


def recompute_rollups(now: datetime) -> dict[str, list[tuple]]:
    """Empty the rollups and their watermarks, roll everything up again in this one process, snapshot."""
    with connection.cursor() as cur:
        cur.execute(f"TRUNCATE {', '.join(r.target for r in ROLLUPS)}")
    RollupWatermark.objects.all().delete()
    run_rollups(now)
    return rollup_snapshot()


def tasks_run(workers: list[procs.Worker], name: str) -> dict[str, int]:
    stats = app.control.inspect(destination=[w.name for w in workers], timeout=2).stats() or {}
    return {w.name: stats.get(w.name, {}).get("total", {}).get(name, 0) for w in workers}


def test_rollups_run_by_two_workers_at_once_equal_a_single_recomputation(cluster):
    _, workers = cluster
    _raw_data()
    before = tasks_run(workers, "telemetry.tasks.run_rollups")
    # Passes every 15 simulated minutes while the data "arrives", then one past the end (every bucket final).
    # Each pass is queued twice, so the two workers run the same pass side by side.
    end = T0 + timedelta(hours=HOURS, minutes=2)
    passes = [T0 + timedelta(minutes=m) for m in range(20, HOURS * 60, 15)] + [end]
    for now in passes:
        for _ in workers:
            telemetry_tasks.run_rollups.delay(now=now.isoformat())
    procs.wait_idle(workers, timeout=60)

    ran = tasks_run(workers, "telemetry.tasks.run_rollups")
    assert sum(ran.values()) - sum(before.values()) == 2 * len(passes)
    assert all(ran[w] > before[w] for w in ran), f"one worker did all the passes: {ran}"
    marks = dict(RollupWatermark.objects.values_list("name", "done_until"))
    assert marks["gpu_1m"] == end - timedelta(minutes=1) and marks["gpu_1h"] == T0 + timedelta(hours=HOURS)

    concurrent = rollup_snapshot()
    minutes = _rows("SELECT gpu_id, bucket, samples FROM telemetry_gpu_sample_1m")
    assert len(minutes) == GPUS * HOURS * 60, "a minute is missing or doubled"
    assert {b for _, b, _ in minutes} == {T0 + timedelta(minutes=m) for m in range(HOURS * 60)}
    assert {n for _, _, n in minutes} == {6}  # six 10 s readings in every minute, none counted twice
    hours = _rows("SELECT gpu_id, bucket, samples FROM telemetry_gpu_sample_1h")
    assert len(hours) == GPUS * HOURS and {n for _, _, n in hours} == {360}
    [(delta,)] = _rows(f"SELECT sum(energy_mj_delta) FROM telemetry_gpu_sample_1h WHERE gpu_id = {RESET_GPU}")
    assert delta == _true_increase(RESET_GPU, "energy_mj"), "counter deltas double-counted or lost"

    assert recompute_rollups(end) == concurrent


def _rows(sql: str) -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute(sql)
        return cur.fetchall()
