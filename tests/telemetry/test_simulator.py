"""The cluster simulator: layout, dynamics, HTTP client and the `simulate` command end to end.

Dynamics tests step small clusters from the fixed epoch; the end-to-end tests run the real
command (and the runner's backfill) against pytest-django's live server.
"""

from __future__ import annotations

import gzip
import http.server
import threading
import time
from collections import Counter
from datetime import timedelta

import orjson
import pytest
from django.core.management import call_command
from django.db import connection

from telemetry.actions import do_create_collector_token
from telemetry.fields import COUNTER, GPU_FIELDS, PORT_FIELDS, POWER_FIELDS
from telemetry.simulator.client import IngestClient, Summary
from telemetry.simulator.dynamics import Cluster
from telemetry.simulator.gpus import REASON_IDLE
from telemetry.simulator.runner import Runner, ServerUnavailable
from telemetry.simulator.topology import build_layout, topology_document
from tests.conftest import FIXED_NOW
from tests.procs import free_port

INTERVAL = 10


def _ticks(cluster: Cluster, count: int, start: int = 0):
    for k in range(start, start + count):
        yield cluster.step(FIXED_NOW + timedelta(seconds=INTERVAL * k))


def _gpu(tick, host: str, index: int = 0) -> dict:
    return next(r["fields"] for r in tick.records("gpus")
                if r["host"] == host and r["index"] == index)


def _counter_values(tick) -> dict[tuple, int | float]:
    """(kind, owner, entity, field) -> value for every counter field in the tick."""
    registry = {"gpus": GPU_FIELDS, "ports": PORT_FIELDS, "power": POWER_FIELDS}
    out = {}
    for kind, fields in registry.items():
        counters = [f.name for f in fields if f.kind == COUNTER]
        for r in tick.records(kind):
            owner = r.get("host") or r.get("switch") or r.get("device")
            entity = r.get("uuid") or r.get("port") or ""
            for name in counters:
                if name in r["fields"]:
                    out[(kind, owner, entity, name)] = r["fields"][name]
    return out


# --- layout ----------------------------------------------------------------------------------
def test_default_layout_has_the_documented_size():
    layout = build_layout()
    assert layout.summary() == {
        "nodes": 256, "gpus": 2048, "racks": 32, "rows": 4, "halls": 1, "leaves": 64,
        "spines": 32, "links": 4096, "pdus": 64, "cooling_loops": 4,
    }
    uuids = [g.uuid for n in layout.nodes for g in n.gpus]
    assert len(set(uuids)) == 2048
    assert len({g.serial for n in layout.nodes for g in n.gpus}) == 2048
    assert [n.u for n in layout.nodes[:8]] == [2, 6, 10, 14, 18, 22, 26, 30]


def test_default_layout_links_every_hca_to_its_rail_leaf_and_every_leaf_to_spines():
    layout = build_layout()
    ends = Counter(e for link in layout.links for e in link)
    assert max(ends.values()) == 1, "a port is cabled twice"
    for n in layout.nodes:
        for h in n.hcas:
            peer = next(b for a, b in layout.links if a == f"{n.hostname}:{h.name}")
            assert peer == f"leaf-r{h.rail}-{n.group + 1:02d}:p{n.slot + 1}"
    for leaf in layout.leaves:
        ups = [b for a, b in layout.links if a.startswith(f"{leaf.name}:")]
        assert len(ups) == 32 and all(b.startswith(f"spine-r{leaf.rail}-") for b in ups)
    for spine in layout.spines:
        assert sum(1 for _, b in layout.links if b.startswith(f"{spine.name}:")) == 64


def test_layout_rejects_a_size_that_is_not_whole_nodes():
    with pytest.raises(ValueError, match="multiple of 8"):
        build_layout(1001)
    with pytest.raises(ValueError):
        build_layout(16392)


def test_gpu_identity_does_not_depend_on_cluster_size():
    small, large = build_layout(64, seed=3), build_layout(2048, seed=3)
    assert [g.uuid for g in small.nodes[0].gpus] == [g.uuid for g in large.nodes[0].gpus]
    assert small.nodes[0].gpus[0].uuid != build_layout(64, seed=4).nodes[0].gpus[0].uuid


@pytest.mark.slow
@pytest.mark.django_db
def test_largest_layout_builds_validates_and_imports():
    from telemetry.models import Gpu, Link, Node
    from telemetry.topology import do_import_topology, validate_topology

    started = time.perf_counter()
    layout = build_layout(16_384)
    doc = topology_document(layout)
    print(f"\n16,384-GPU layout and document built in {time.perf_counter() - started:.2f} s")
    assert layout.summary() == {
        "nodes": 2048, "gpus": 16384, "racks": 256, "rows": 32, "halls": 2, "leaves": 512,
        "spines": 256, "links": 32768, "pdus": 512, "cooling_loops": 32,
    }
    assert validate_topology(doc) == []
    started = time.perf_counter()
    do_import_topology(doc)
    print(f"16,384-GPU topology imported in {time.perf_counter() - started:.1f} s")
    assert (Node.objects.count(), Gpu.objects.count(), Link.objects.count()) == (2048, 16384, 32768)


# --- dynamics --------------------------------------------------------------------------------
def test_same_seed_gives_the_same_records():
    def run(seed: int) -> list[bytes]:
        cluster = Cluster.build(128, seed=seed)
        return [orjson.dumps([t.body(b) for b in t.batches]) for t in _ticks(cluster, 6)]

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_records_use_registry_fields_with_integer_counters():
    tick = next(_ticks(Cluster.build(64), 1))
    for kind, fields in (("gpus", GPU_FIELDS), ("ports", PORT_FIELDS), ("power", POWER_FIELDS)):
        registry = {f.name: f for f in fields}
        for record in tick.records(kind):
            assert set(record["fields"]) <= set(registry), kind
            for name, value in record["fields"].items():
                assert not registry[name].is_int or isinstance(value, int), (kind, name, value)
    assert len(tick.records("gpus")) == 64


def test_counters_never_decrease_except_across_a_reboot():
    cluster = Cluster.build(256, seed=2)
    last: dict[tuple, int | float] = {}
    grew = Counter()
    rebooted_host = "gpu-0003"
    reset_seen = False
    for k, tick in enumerate(_ticks(cluster, 100)):
        if k == 50:
            cluster.reboot_node(rebooted_host, tick.time, down_s=25)
        for host in tick.rebooted:  # counters of a rebooted node may restart from zero
            last = {key: v for key, v in last.items() if key[1] != host}
        for key, value in _counter_values(tick).items():
            if key in last:
                assert value >= last[key], f"{key} went from {last[key]} to {value} at tick {k}"
                grew[key[3]] += value > last[key]
            elif key[1] == rebooted_host and k > 50 and key[3] == "energy_mj":
                reset_seen = True
                assert value < 10_000_000  # energy since boot: one tick's worth
            last[key] = value
    assert reset_seen
    for name in ("energy_mj", "nvlink_bandwidth", "xmit_data_bytes", "rcv_pkts", "energy_j",
                 "xmit_wait"):
        assert grew[name] > 0, name


def test_power_follows_utilisation():
    tick = next(_ticks(Cluster.build(512, seed=3), 1))
    gpus = [r["fields"] for r in tick.records("gpus")]
    idle = [g["power_w"] for g in gpus if g["gpu_util"] == 0]
    busy = [g["power_w"] for g in gpus if g["gpu_util"] >= 85]
    assert idle and busy
    assert 55 < min(idle) and max(idle) < 90
    assert min(busy) > 450 and max(busy) <= 700
    assert all(g["throttle_reasons"] & REASON_IDLE for g in gpus if g["gpu_util"] == 0)
    # A rack's two PDUs carry its nodes' GPU power plus the nodes' own overhead.
    pdus = {r["device"]: r["fields"]["watts"] for r in tick.records("power")
            if r["device"].startswith("pdu-")}
    for batch in tick.batches:
        gpu_w = sum(r["fields"]["power_w"] for r in batch["gpus"])
        rack_w = pdus[f"pdu-{batch['rack']}-a"] + pdus[f"pdu-{batch['rack']}-b"]
        assert gpu_w + 8 * 1500 < rack_w < gpu_w * 1.35 + 8 * 1500 + 2000


def test_temperature_lags_power_after_a_job_starts():
    cluster = Cluster.build(64, seed=4, scheduling=False, faults=False)
    before = list(_ticks(cluster, 3))[-1]
    idle = _gpu(before, "gpu-0001")
    cluster.start_job(["gpu-0001", "gpu-0002"], "pretrain", before.time, minutes=120)
    seen = [_gpu(t, "gpu-0001") for t in _ticks(cluster, 30, start=3)]
    temps = [g["gpu_temp"] for g in seen]
    assert seen[0]["power_w"] > 3 * idle["power_w"], "power steps up at once"
    climbing = all(b > a for a, b in zip(temps[:10], temps[1:11], strict=True))
    assert climbing, "temperature climbs tick by tick"
    rise = temps[-1] - idle["gpu_temp"]
    assert rise > 20
    assert temps[0] - idle["gpu_temp"] < 0.35 * rise, "one tick covers only part of the way"
    assert seen[-1]["memory_temp"] > idle["memory_temp"] + 15
    assert seen[-1]["fb_used"] > 40_000 and idle["fb_used"] == 0


def test_ingest_traffic_shows_on_hcas_and_their_leaf_ports():
    cluster = Cluster.build(64, seed=4, scheduling=False, faults=False)
    first = list(_ticks(cluster, 2))[-1]
    cluster.start_job(["gpu-0001", "gpu-0002"], "pretrain", first.time, minutes=120)
    a, b = list(_ticks(cluster, 12, start=2))[-2:]

    def sent(tick, owner, port):
        return next(r["fields"]["xmit_data_bytes"] for r in tick.records("ports")
                    if r.get("host", r.get("switch")) == owner and r["port"] == port)

    per_s = (sent(b, "gpu-0001", "mlx5_3/1") - sent(a, "gpu-0001", "mlx5_3/1")) / INTERVAL
    idle_per_s = (sent(b, "gpu-0005", "mlx5_3/1") - sent(a, "gpu-0005", "mlx5_3/1")) / INTERVAL
    assert per_s > 1e9 > idle_per_s
    leaf_rx = next(r["fields"]["rcv_data_bytes"] for r in b.records("ports")
                   if r.get("switch") == "leaf-r3-01" and r["port"] == "p1")
    assert leaf_rx > 0


def test_tick_builder_is_fast_for_the_largest_cluster():
    cluster = Cluster.build(16_384)
    next(_ticks(cluster, 1))
    started = time.perf_counter()
    tick = next(_ticks(cluster, 1, start=1))
    took = time.perf_counter() - started
    print(f"\n16,384-GPU tick: {len(tick.records('gpus'))} GPU and {len(tick.records('ports'))} "
          f"port records built in {took * 1000:.0f} ms")
    assert len(tick.records("gpus")) == 16_384
    assert took < 0.5 * INTERVAL


# --- the HTTP client against a real local receiver --------------------------------------------
class _Receiver(http.server.BaseHTTPRequestHandler):
    """Answers 503 + Retry-After to the first POST, then 200; keeps every decoded body."""

    protocol_version = "HTTP/1.1"
    bodies: list[dict] = []
    posts = 0

    def do_POST(self):  # noqa: N802 (http.server's naming)
        data = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).posts += 1
        if type(self).posts == 1:
            error = {"error": {"code": "unavailable", "message": "retry"}}
            self._answer(503, error, {"Retry-After": "0"})
            return
        assert self.headers["Content-Encoding"] == "gzip"
        type(self).bodies.append(orjson.loads(gzip.decompress(data)))
        self._answer(200, {"accepted": 5, "rejected": 0})

    def _answer(self, status, doc, headers=None):
        payload = orjson.dumps(doc)
        self.send_response(status)
        headers = {"Content-Type": "application/json", "Content-Length": str(len(payload)),
                   **(headers or {})}
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


def test_client_retries_a_503_and_sends_gzip_json():
    _Receiver.bodies, _Receiver.posts = [], 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = IngestClient(f"http://127.0.0.1:{server.server_address[1]}", "bwc_x", concurrency=2)
    try:
        tick = next(_ticks(Cluster.build(128), 1))  # two racks: two requests
        summary = client.send_many([tick.body(b) for b in tick.batches])
    finally:
        client.close()
        server.shutdown()
    assert (summary.requests, summary.failed, summary.retries, summary.accepted) == (2, 0, 1, 10)
    assert sorted(len(b["gpus"]["uuid"]) for b in _Receiver.bodies) == [64, 64]  # columnar: one uuid per GPU


def test_runner_waits_for_a_server_that_is_not_up():
    port = free_port()  # closed again: nothing listens there
    lines: list[str] = []
    fake_now = [0.0]
    client = IngestClient(f"http://127.0.0.1:{port}", "bwc_x")
    runner = Runner(Cluster.build(8), client, interval=INTERVAL, write=lines.append,
                    server=f"http://127.0.0.1:{port}", clock=lambda: fake_now[0],
                    sleep=lambda s: fake_now.__setitem__(0, fake_now[0] + s))
    with pytest.raises(ServerUnavailable):
        runner.wait_for_server(timeout=30)
    client.close()
    assert len(lines) >= 3 and "waiting for the server" in lines[0] and "retrying in" in lines[0]


class _SlowClient:
    """Stands in for the HTTP edge: records tick times, and each request costs 3 s of clock."""

    def __init__(self, clock: list[float]):
        self.clock, self.times = clock, []

    def send_many(self, bodies):
        self.times.append(bodies[0]["time"])
        self.clock[0] += 3
        return Summary(requests=len(bodies))


def test_backfill_catches_up_on_the_time_it_took_then_ticks_live():
    clock = [FIXED_NOW.timestamp()]
    client = _SlowClient(clock)
    runner = Runner(Cluster.build(8), client, interval=INTERVAL, write=lambda line: None,
                    clock=lambda: clock[0], sleep=lambda s: clock.__setitem__(0, clock[0] + s))
    runner.backfill(1)
    runner.run(2)
    expected = [(FIXED_NOW + timedelta(seconds=s)).isoformat().replace("+00:00", "Z")
                for s in range(-60, 40, INTERVAL)]
    assert client.times == expected, "no gap and no repeat between history and live ticks"


# --- end to end through the real ingest API ------------------------------------------------------
def _count(table: str) -> int:
    with connection.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {table}")
        return cur.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_simulate_command_lands_one_tick_in_the_hypertables(live_server, capsys):
    # The command ticks on the real clock; the server checks sample times against the same clock.
    token = do_create_collector_token("simulator-test")
    call_command("simulate", "--server", live_server.url, "--token", token, "--gpus", "64",
                 "--once", "--seed", "9")
    out = capsys.readouterr().out
    assert "64 GPUs on 8 nodes in 1 racks" in out and "topology imported" in out
    line = next(x for x in out.splitlines() if " gpus=64 " in x)
    assert "requests=1 " in line and "rejected=0 " in line and "failed=" not in line
    assert _count("telemetry_gpu_sample") == 64
    # HCAs, leaf downlinks, leaf uplinks, spine ports.
    assert _count("telemetry_port_sample") == 4 * 64
    assert _count("telemetry_power_sample") == 3  # two PDUs and the row's cooling loop
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM telemetry_gpu_sample s "
                    "JOIN telemetry_gpu g ON g.id = s.gpu_id "
                    "JOIN telemetry_node n ON n.id = g.node_id WHERE n.rack_id IS NOT NULL")
        assert cur.fetchone()[0] == 64, "samples land on the GPUs the topology placed"


def _placed_site(monkeypatch, gpus: int) -> str:
    """The server's clock pinned to the fixtures' epoch, a simulated cluster's topology imported; a collector
    token."""
    from telemetry.api import views
    from telemetry.topology import do_import_topology

    pinned = views.TimeParser(FIXED_NOW, timedelta(minutes=5), timedelta(days=7))
    monkeypatch.setattr(views, "_times", lambda: pinned)
    do_import_topology(topology_document(build_layout(gpus, seed=9)))
    return do_create_collector_token("simulator-test")


@pytest.mark.django_db(transaction=True)
def test_backfill_sends_history_at_the_interval(live_server, monkeypatch):
    token = _placed_site(monkeypatch, 16)
    client = IngestClient(live_server.url, token)
    lines: list[str] = []
    runner = Runner(Cluster.build(16, seed=9), client, interval=INTERVAL, write=lines.append,
                    server=live_server.url, clock=FIXED_NOW.timestamp, sleep=lambda s: None)
    try:
        total = runner.backfill(1)
        runner.run(1)
    finally:
        client.close()
    assert total.requests == 6 and total.failed == 0 and total.rejected == 0
    with connection.cursor() as cur:
        cur.execute("SELECT min(time), max(time), count(DISTINCT time) FROM telemetry_gpu_sample")
        first, last, count = cur.fetchone()
    assert (first, last, count) == (FIXED_NOW - timedelta(minutes=1), FIXED_NOW, 7)
    assert any(x.startswith("2026-11-30T12:00:00Z gpus=16 ") for x in lines)


def _stored() -> dict[str, list[tuple]]:
    out = {}
    with connection.cursor() as cur:
        for table in ("telemetry_gpu_sample", "telemetry_port_sample", "telemetry_power_sample",
                      "telemetry_narrow_sample"):
            cur.execute(f"SELECT * FROM {table} ORDER BY 1, 2, 3")
            out[table] = cur.fetchall()
            cur.execute(f"DELETE FROM {table}")
    return out


@pytest.mark.django_db(transaction=True)
def test_arrow_and_json_bodies_of_the_same_ticks_store_the_same_rows(live_server, monkeypatch):
    token = _placed_site(monkeypatch, 32)
    stored = {}
    for body in ("json", "arrow"):
        client = IngestClient(live_server.url, token, body=body)
        runner = Runner(Cluster.build(32, seed=9), client, interval=INTERVAL, write=lambda line: None,
                        server=live_server.url, clock=FIXED_NOW.timestamp, sleep=lambda s: None)
        try:
            total = runner.backfill(1)
        finally:
            client.close()
        assert total.failed == 0 and total.rejected == 0
        stored[body] = _stored()
    assert stored["arrow"] == stored["json"]
    assert len(stored["arrow"]["telemetry_gpu_sample"]) == 32 * 6
