"""The beat scraper pulls a real dcgm-exporter capture from a real local HTTP endpoint."""

from __future__ import annotations

import http.server
import threading
from datetime import timedelta

import pytest
from django.db import connection

from telemetry.ingest import scrape
from telemetry.models import ScrapeTarget
from tests.conftest import FIXED_NOW

pytestmark = pytest.mark.django_db


@pytest.fixture
def exporter(shared_data):
    """A loopback HTTP server playing dcgm-exporter: /metrics serves a real capture."""
    body = (shared_data / "dcgm/cncf-k8s-ai-conformance/v1.35_upcloud.prom").read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/metrics":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", body
    server.shutdown()


@pytest.fixture(autouse=True)
def _clock(monkeypatch):
    real = scrape.TimeParser
    monkeypatch.setattr(
        scrape, "TimeParser", lambda now, fut, age: real(FIXED_NOW, timedelta(minutes=5), timedelta(days=7))
    )


def test_scrape_writes_every_gpu_and_records_success(exporter):
    base, body = exporter
    target = ScrapeTarget.objects.create(url=f"{base}/metrics")
    result = scrape.scrape_target(target)
    assert result is not None and result.accepted > 0
    target.refresh_from_db()
    assert target.last_error == "" and target.last_samples == result.accepted
    uuids = {ln.split('UUID="')[1].split('"')[0] for ln in body.decode().splitlines() if 'UUID="' in ln}
    with connection.cursor() as cur:
        cur.execute("SELECT g.uuid FROM telemetry_gpu_sample_latest l JOIN telemetry_gpu g ON g.id = l.gpu_id")
        assert {u for (u,) in cur.fetchall()} == uuids


def test_scrape_failure_is_recorded_not_raised(exporter):
    base, _ = exporter
    target = ScrapeTarget.objects.create(url=f"{base}/wrong-path")
    assert scrape.scrape_target(target) is None
    target.refresh_from_db()
    assert "HTTP 404" in target.last_error


def test_scrape_of_closed_port_is_recorded():
    target = ScrapeTarget.objects.create(url="http://127.0.0.1:9/metrics")
    assert scrape.scrape_target(target) is None
    target.refresh_from_db()
    assert "cannot fetch" in target.last_error


def test_scrape_task_skips_disabled_targets(exporter):
    from telemetry.tasks import scrape_one

    base, _ = exporter
    target = ScrapeTarget.objects.create(url=f"{base}/metrics", enabled=False)
    assert scrape_one(target.id) == 0
    target.enabled = True
    target.save()
    assert scrape_one(target.id) > 0


def test_scrape_targets_command_adds_lists_and_refuses_bad_urls(capsys):
    from django.core.management import CommandError, call_command

    call_command("scrape_targets", "add", "http://gpu-0001:9400/metrics", "--host", "gpu-0001")
    call_command("scrape_targets", "list")
    assert "enabled   http://gpu-0001:9400/metrics  last=never" in capsys.readouterr().out
    with pytest.raises(CommandError, match="not an http"):
        call_command("scrape_targets", "add", "gpu-0001:9400")
    call_command("scrape_targets", "disable", "http://gpu-0001:9400/metrics")
    assert not ScrapeTarget.objects.get().enabled
