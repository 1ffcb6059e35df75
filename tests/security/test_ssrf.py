"""The outbound URL guard (alerts.urlguard) against server-side request forgery.

Channel URLs are refused when they reach loopback, private, link-local (cloud metadata) or other non-public
addresses, however they are spelt, unless OUTBOUND_URL_ALLOWLIST names them: at save time (the channel form,
the API's channel test: a 400 naming the field, the address and why) and at send time, where the address
checked is the address connected to (DNS rebinding), TLS still names the host, and redirects are not
followed. Receivers are real local servers on loopback, allowlisted explicitly by each test that uses one.
"""

from __future__ import annotations

import http.server
import re
import socket
import ssl
import subprocess
import threading
from contextlib import contextmanager

import pytest
from django.core.exceptions import ImproperlyConfigured

from alerts import delivery, transports, urlguard
from alerts.forms import ChannelForm
from alerts.models import Channel, Notification, NotificationStatus
from alerts.receiver import Receiver
from tests import personas
from tests.conftest import FIXED_NOW

LOOPBACK = ("127.0.0.1", "::1", "localhost")
REFUSED = [
    # (url, the address the refusal names, words of its reason)
    ("http://127.0.0.1:8080/hook", "127.0.0.1", "loopback"),
    ("http://localhost/hook", "127.0.0.1", "loopback"),
    ("http://10.20.30.40/", "10.20.30.40", "private"),
    ("http://172.16.0.1/", "172.16.0.1", "private"),
    ("http://192.168.1.1/", "192.168.1.1", "private"),
    ("http://[fd12:3456::1]/", "fd12:3456::1", "private"),
    ("http://169.254.169.254/latest/meta-data/", "169.254.169.254", "metadata"),
    ("http://169.254.1.1/", "169.254.1.1", "link-local"),
    ("http://[fe80::1]/", "fe80::1", "link-local"),
    ("http://[fd00:ec2::254]/", "fd00:ec2::254", "metadata"),
    ("http://metadata.google.internal/computeMetadata/v1/", "metadata.google.internal", "metadata"),
    ("http://metadata/", "metadata", "metadata"),
    ("http://0.0.0.0/", "0.0.0.0", "unspecified"),
    ("http://[::]/", "::", "unspecified"),
    ("http://224.0.0.251/", "224.0.0.251", "multicast"),
    ("http://240.0.0.1/", "240.0.0.1", "address"),
    ("http://100.64.0.1/", "100.64.0.1", "not a globally routable"),
    ("http://[::ffff:127.0.0.1]/", "::ffff:7f00:1", "IPv6 form of 127.0.0.1"),
    ("http://[::ffff:169.254.169.254]/", "::ffff:a9fe:a9fe", "metadata"),
    ("http://[::ffff:a9fe:a9fe]/", "::ffff:a9fe:a9fe", "metadata"),
    ("http://[64:ff9b::a00:1]/", "64:ff9b::a00:1", "IPv6 form of 10.0.0.1"),
    ("http://[2002:7f00:1::]/", "2002:7f00:1::", "IPv6 form of 127.0.0.1"),
    ("http://2130706433/", "2130706433", "127.0.0.1"),
    ("http://0x7f.1/", "0x7f.1", "127.0.0.1"),
    ("http://0177.0.0.1/", "0177.0.0.1", "127.0.0.1"),
    ("http://0xa9fea9fe/", "0xa9fea9fe", "169.254.169.254"),
    ("http://127.1/", "127.1", "127.0.0.1"),
    ("http://evil.example@127.0.0.1/", "evil.example@127.0.0.1", "user@"),
    ("http://user:pw@hooks.example.com/", "user:pw@hooks.example.com", "user@"),
    ("ftp://hooks.example.com/", "ftp", "only http and https"),
    ("file:///etc/passwd", "file", "only http and https"),
    ("gopher://127.0.0.1:6379/_FLUSHALL", "gopher", "only http and https"),
    ("http:///nohost", "http:///nohost", "no host"),
]


@pytest.fixture
def allow(settings):
    """Set OUTBOUND_URL_ALLOWLIST for one test (empty by default: public addresses only)."""
    settings.OUTBOUND_URL_ALLOWLIST = ()

    def set_to(*entries: str) -> None:
        settings.OUTBOUND_URL_ALLOWLIST = entries
    return set_to


@pytest.fixture
def receiver():
    with Receiver(secret="ssrf-test-secret") as rec:
        yield rec


@contextmanager
def fake_dns(answers: dict[str, list[list[str]]], monkeypatch):
    """The resolver as an attacker's DNS server would answer: each lookup of a name takes the next answer.
    Only the names given are faked; every lookup is counted."""
    real, calls = socket.getaddrinfo, []

    def getaddrinfo(host, port, *args, **kwargs):
        if host not in answers:
            return real(host, port, *args, **kwargs)
        calls.append(host)
        ips = answers[host][min(len(calls), len(answers[host])) - 1]
        return [(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port))
                for ip in ips]
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield calls


def channel(url: str, kind: str = "webhook") -> Channel:
    return Channel.objects.create(name=f"c-{Channel.objects.count()}", kind=kind, config={"url": url},
                                  secret="ssrf-test-secret")


def notify(ch: Channel) -> Notification:
    return Notification.objects.create(channel=ch, event="test", dedup_key="k" * 64, created_at=FIXED_NOW,
                                       payload={"title": "t", "alerts": []})


# --- The check itself --------------------------------------------------------------------------------

@pytest.mark.parametrize(("url", "address", "why"), REFUSED, ids=[r[0] for r in REFUSED])
def test_non_public_urls_are_refused_with_the_address_and_reason(allow, url, address, why):
    with pytest.raises(urlguard.RefusedURL) as refused:
        urlguard.check_url(url)
    assert refused.value.address == address
    assert why in refused.value.reason


@pytest.mark.parametrize(("url", "port", "address"), [
    ("https://8.8.8.8/hook", 443, "8.8.8.8"),
    ("http://[2606:4700:4700::1111]:8443/x", 8443, "2606:4700:4700::1111"),
    ("http://1.1.1.1", 80, "1.1.1.1"),
])
def test_public_addresses_pass(allow, url, port, address):
    assert urlguard.check_url(url) == urlguard.Target(address, port, (address,))


def test_allowlist_names_hosts_ports_and_networks(allow, monkeypatch):
    allow("127.0.0.1:58025", "10.20.0.0/16", "[::1]:9000", "metadata.google.internal")
    assert urlguard.check_url("http://127.0.0.1:58025/webhook").addresses == ("127.0.0.1",)
    assert urlguard.check_url("http://10.20.3.4/").addresses == ("10.20.3.4",)
    assert urlguard.check_url("http://[::1]:9000/").addresses == ("::1",)
    with fake_dns({"metadata.google.internal": [["169.254.169.254"]]}, monkeypatch):
        assert urlguard.check_url("http://metadata.google.internal/").addresses == ("169.254.169.254",)
    for url in ("http://127.0.0.1:58026/", "http://10.21.0.1/", "http://[::1]:9001/", "http://169.254.169.254/"):
        with pytest.raises(urlguard.RefusedURL):
            urlguard.check_url(url)
    # A numeric disguise or credentials are refused even for an allowlisted address.
    for url in ("http://2130706433:58025/", "http://u@127.0.0.1:58025/", "ftp://127.0.0.1:58025/"):
        with pytest.raises(urlguard.RefusedURL):
            urlguard.check_url(url)


def test_every_resolved_address_is_checked(allow, monkeypatch):
    with fake_dns({"hooks.mixed.test": [["8.8.8.8", "10.0.0.7"]]}, monkeypatch):
        with pytest.raises(urlguard.RefusedURL) as refused:
            urlguard.check_url("https://hooks.mixed.test/x")
    assert refused.value.address == "10.0.0.7"
    assert "hooks.mixed.test (10.0.0.7) is a private address" in refused.value.reason


@pytest.mark.parametrize("value", ["bad host", "10.0.0.0/33", "[::1]:99999", "[zz]:80", "host:port"])
def test_a_malformed_allowlist_setting_names_the_variable_and_entry(value):
    from dashboard.settings import _outbound_allowlist

    with pytest.raises(ImproperlyConfigured, match=re.escape(f"OUTBOUND_URL_ALLOWLIST entry '{value}'")):
        _outbound_allowlist(value)
    assert _outbound_allowlist(" 127.0.0.1:58025, 10.0.0.0/8,[::1] ,Hooks.Example") == (
        "127.0.0.1:58025", "10.0.0.0/8", "[::1]", "hooks.example")


# --- Save time -----------------------------------------------------------------------------------

@pytest.mark.django_db
def test_channel_form_refuses_the_metadata_url_naming_field_and_address(allow):
    form = ChannelForm(data={"name": "meta", "kind": "webhook", "secret": "x", "enabled": "on",
                             "config": '{"url": "http://169.254.169.254/latest/meta-data/iam/"}'})
    assert not form.is_valid()
    message = form.errors["config"][0]
    assert "169.254.169.254" in message and "cloud metadata endpoint" in message
    assert not Channel.objects.exists()


@pytest.mark.django_db
def test_channel_form_takes_a_public_url_and_an_allowlisted_one(allow):
    allow("127.0.0.1")
    for i, url in enumerate(("https://8.8.8.8/hook", "http://127.0.0.1:58025/webhook")):
        form = ChannelForm(data={"name": f"ok-{i}", "kind": "slack", "config": f'{{"url": "{url}"}}', "secret": ""})
        assert form.is_valid(), form.errors
    email = ChannelForm(data={"name": "mail", "kind": "email", "config": '{"to": ["oncall@example.com"]}'})
    assert email.is_valid(), email.errors  # email goes to the operator's SMTP server (settings), not a URL


@pytest.mark.django_db
def test_api_channel_test_answers_400_naming_the_field_and_queues_nothing(allow, client, django_user_model):
    personas.signed_in(personas.operator("op"), client)
    ch = channel("http://0x7f.1:6379/")
    response = client.post(f"/api/v1/channels/{ch.pk}/test", content_type="application/json")
    assert response.status_code == 400, response.content
    err = response.json()["error"]
    assert err["code"] == "invalid" and err["field"] == "config.url"
    assert "0x7f.1" in err["message"] and "127.0.0.1" in err["message"]
    assert not Notification.objects.exists()


# --- Send time -----------------------------------------------------------------------------------

@pytest.mark.django_db
def test_send_to_a_loopback_receiver_is_refused_unless_allowlisted(allow, receiver):
    ch = channel(receiver.url("/webhook"))
    result = transports.get("webhook").notify(notify(ch))
    assert result.outcome == "permanent"
    assert "refused Webhook url" in result.error and "127.0.0.1" in result.error and "loopback" in result.error
    assert receiver.requests == []

    allow(f"127.0.0.1:{receiver.port}")
    assert transports.get("webhook").notify(notify(ch)).ok
    assert len(receiver.requests) == 1 and receiver.requests[0].signature_ok


@pytest.mark.django_db
def test_delivery_of_a_refused_url_disables_the_channel_with_the_reason(allow, receiver):
    """A channel saved before the guard (or through the ORM) is caught by the worker: no request leaves."""
    ch = channel(receiver.url("/slack"), kind="slack")
    n = notify(ch)
    assert delivery.deliver_notification(n.pk) == "failed"
    ch.refresh_from_db()
    n.refresh_from_db()
    assert n.status == NotificationStatus.FAILED
    assert not ch.enabled and "127.0.0.1" in ch.disabled_reason and "loopback" in ch.disabled_reason
    assert receiver.requests == []


@pytest.mark.django_db
def test_dns_rebinding_connects_to_the_address_that_was_checked(allow, receiver, monkeypatch):
    """The name resolves to the allowlisted receiver when checked, then to the metadata endpoint: the
    connection still goes to the checked address (one lookup), with the URL's host in the Host header."""
    allow("127.0.0.1")
    name = "hooks.rebind.test"
    with fake_dns({name: [["127.0.0.1"], ["169.254.169.254"]]}, monkeypatch) as lookups:
        result = transports.get("webhook").notify(notify(channel(f"http://{name}:{receiver.port}/webhook")))
    assert result.ok, result.error
    assert lookups == [name]
    assert receiver.requests[0].headers["host"] == f"{name}:{receiver.port}"


@pytest.mark.django_db
def test_a_name_resolving_to_metadata_is_refused_before_connecting(allow, receiver, monkeypatch):
    allow(f"127.0.0.1:{receiver.port}")
    with fake_dns({"hooks.evil.test": [["169.254.169.254"]]}, monkeypatch):
        result = transports.get("teams").notify(notify(channel(f"http://hooks.evil.test:{receiver.port}/t", "teams")))
    assert result.outcome == "permanent" and "hooks.evil.test (169.254.169.254)" in result.error
    assert receiver.requests == []


class _Redirector(http.server.BaseHTTPRequestHandler):
    """Answers every POST with a redirect to the cloud metadata endpoint."""

    hits: list[str] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        self.hits.append(self.path)
        self.send_response(307)
        self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@contextmanager
def serve(handler, *, tls: ssl.SSLContext | None = None):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if tls:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.django_db
def test_redirects_are_not_followed(allow, monkeypatch):
    allow("127.0.0.1")
    _Redirector.hits = []
    followed = []
    monkeypatch.setattr(urlguard, "check_url", lambda url, real=urlguard.check_url: followed.append(url) or real(url))
    with serve(_Redirector) as port:
        result = transports.get("webhook").notify(notify(channel(f"http://127.0.0.1:{port}/hook")))
    assert result.outcome == "permanent" and result.status_code == 307
    assert _Redirector.hits == ["/hook"]
    assert followed == [f"http://127.0.0.1:{port}/hook"]  # the metadata URL was never even looked at


class _Echo(http.server.BaseHTTPRequestHandler):
    seen: dict = {}

    def do_GET(self):  # noqa: N802 - http.server's name
        _Echo.seen["host"] = self.headers["Host"]
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


def test_https_to_a_checked_address_keeps_sni_and_the_certificate_check(allow, tmp_path, monkeypatch):
    """The socket goes to the checked address, but TLS still sends the URL's host as SNI and verifies the
    certificate against it; a certificate for another name fails."""
    allow("127.0.0.1")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=hooks.tls.test", "-addext", "subjectAltName=DNS:hooks.tls.test", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True)
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)
    sni = []
    server_tls.sni_callback = lambda sock, name, ctx: sni.append(name)
    client_tls = ssl.create_default_context(cafile=str(cert))
    names = {"hooks.tls.test": [["127.0.0.1"]], "other.tls.test": [["127.0.0.1"]]}
    with fake_dns(names, monkeypatch), serve(_Echo, tls=server_tls) as port:
        with urlguard.opener(context=client_tls).open(f"https://hooks.tls.test:{port}/", timeout=5) as resp:
            assert resp.read() == b"ok"
        with pytest.raises(Exception, match="certificate|hostname"):
            urlguard.opener(context=client_tls).open(f"https://other.tls.test:{port}/", timeout=5)
    assert sni[0] == "hooks.tls.test" and _Echo.seen["host"] == f"hooks.tls.test:{port}"
