"""Every real dcgm-exporter capture in ../shared/data/dcgm ingests unchanged through the push API."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection

from telemetry.actions import do_create_collector_token
from tests.conftest import FIXED_NOW, SHARED_DATA

pytestmark = pytest.mark.django_db(transaction=True)
CAPTURES = sorted((p.name, p) for p in (SHARED_DATA / "dcgm").glob("*/*.prom"))


@pytest.fixture(autouse=True)
def _fixed_clock(monkeypatch):
    from telemetry.api import views

    monkeypatch.setattr(views, "_times", lambda: views.TimeParser(FIXED_NOW, timedelta(minutes=5), timedelta(days=7)))


@pytest.fixture
def push(client):
    token = do_create_collector_token("dcgm-pusher")

    def _push(text: str | bytes, query: str = ""):
        return client.post(f"/api/v1/ingest/prometheus{query}", data=text, content_type="text/plain",
                           HTTP_AUTHORIZATION=f"Bearer {token}")

    return _push


def _rows(sql: str, params=()):
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall()


def _captures(shared_data):
    return sorted((shared_data / "dcgm").glob("*/*.prom"))


def test_there_are_real_captures(shared_data):
    assert len(_captures(shared_data)) >= 8


@pytest.mark.parametrize("name", [n for n, _ in CAPTURES] or ["missing"])
def test_real_capture_ingests(name, shared_data, push):
    path = next(p for p in _captures(shared_data) if p.name == name)
    text = path.read_text()
    resp = push(text)
    assert resp.status_code == 200, resp.content
    uuids = set(re.findall(r'UUID="([^"]+)"', text))
    got = _rows("SELECT g.uuid FROM telemetry_gpu_sample s JOIN telemetry_gpu g ON g.id = s.gpu_id")
    assert {u for (u,) in got} == uuids
    # One value per distinct series: the kops capture holds two identical scrapes back to back,
    # and a series repeated without a timestamp is the same sample.
    series = {ln.rsplit(" ", 1)[0] for ln in text.splitlines() if ln.strip() and not ln.startswith("#")}
    data = resp.json()
    assert data["accepted"] + data["blanks"] + data["rejected"] == len(series)
    # Energy is a counter in mJ, stored unchanged.
    for uuid, value in re.findall(r'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION\{[^}]*UUID="([^"]+)"[^}]*\} (\d+)', text):
        stored = _rows(
            "SELECT l.energy_mj FROM telemetry_gpu_sample_latest l "
            "JOIN telemetry_gpu g ON g.id = l.gpu_id WHERE g.uuid = %s",
            [uuid],
        )
        assert stored == [(int(value),)]


def test_mig_capture_keeps_gpu_and_instance_apart(shared_data, push):
    text = (shared_data / "dcgm/nvidia-cloud-native-docs/a100-mig-1g.5gb-dcgm-exporter.prom").read_text()
    assert push(text).status_code == 200
    assert _rows("SELECT gr_engine_active FROM telemetry_gpu_sample") == [(pytest.approx(0.995630),)]
    mig = _rows("SELECT m.gi_id, m.profile, s.gr_engine_active FROM telemetry_mig_sample s "
                "JOIN telemetry_miginstance m ON m.id = s.mig_id")
    assert mig == [(13, "1g.5gb", pytest.approx(0.995687))]
    assert _rows("SELECT mig_mode FROM telemetry_gpu") == [(True,)]


def test_not_supported_sentinel_stored_as_missing(shared_data, push):
    text = (shared_data / "dcgm/cncf-k8s-ai-conformance/v1.35_kops.prom").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("DCGM_FI_DEV_MEMORY_TEMP{"))
    replaced = text.count(line)
    text = text.replace(line, line.rsplit(" ", 1)[0] + " 9223372036854775794")
    resp = push(text)
    assert resp.status_code == 200 and resp.json()["blanks"] == replaced
    assert _rows("SELECT memory_temp, gpu_temp IS NOT NULL FROM telemetry_gpu_sample") == [(None, True)]


def test_unknown_dcgm_field_goes_to_narrow_table(shared_data, push):
    text = (shared_data / "dcgm/cncf-k8s-ai-conformance/v1.35_kops.prom").read_text()
    assert push(text).status_code == 200
    fields = {f for (f,) in _rows("SELECT field FROM telemetry_narrow_sample WHERE entity_kind = 'gpu'")}
    assert "DCGM_FI_DEV_VGPU_LICENSE_STATUS" in fields


def test_malformed_exposition_400_names_line(shared_data, push):
    text = (shared_data / "dcgm/cncf-k8s-ai-conformance/v1.35_vks.prom").read_text().splitlines()
    bad = [i for i, ln in enumerate(text) if ln.startswith("DCGM_")][3]
    text[bad] = text[bad].replace('"}', "}", 1)  # leaves the last label value unterminated
    resp = push("\n".join(text))
    assert resp.status_code == 400
    assert resp.json()["error"]["where"] == f"line {bad + 1}"
    assert _rows("SELECT count(*) FROM telemetry_gpu_sample") == [(0,)]


def test_nan_in_exposition_rejected_per_sample(shared_data, push):
    text = (shared_data / "dcgm/cncf-k8s-ai-conformance/v1.35_vks.prom").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("DCGM_FI_DEV_GPU_UTIL{"))
    resp = push(text.replace(line, line.rsplit(" ", 1)[0] + " NaN"))
    assert resp.status_code == 200 and resp.json()["rejected"] == text.count(line)
    assert _rows("SELECT gpu_util FROM telemetry_gpu_sample") == [(None,)]


def test_exposition_without_hostname_needs_host_param(push):
    text = 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-x"} 5\n'
    assert push(text).status_code == 400
    assert push(text, "?host=bare-metal-7").status_code == 200
    assert _rows("SELECT n.hostname FROM telemetry_node n") == [("bare-metal-7",)]
