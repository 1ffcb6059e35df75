"""The outbound URL guard: channel URLs must not reach the inside of the network (SSRF).

An operator types a webhook URL; the delivery worker then POSTs to it from inside the cluster, where
loopback services, the cloud metadata endpoint (169.254.169.254) and private subnets are reachable. So a URL
is refused unless every address it stands for is public, or the setting OUTBOUND_URL_ALLOWLIST names it
(a host, host:port or network). It is checked twice:

1. When a channel is saved or tested (`validate_channel`, `check_url`): a ValidationError naming the
   field, the refused address and why.
2. When a notification is sent (`opener()`): the host is resolved once, every address is checked, and the
   connection goes to a checked address. Resolving again at connect time would let a DNS answer that
   changed in between (rebinding) slip past the check. TLS SNI, certificate checks and the Host header
   still use the URL's host name. Redirects are never followed (alerts.transports.base refuses them), and
   no proxy is used: a proxy would connect to an address nobody checked.

Only http and https are allowed, a URL with user:password@ is refused (credentials belong in the channel's
secret, and "http://trusted@10.0.0.1/" is a classic disguise), and so is an IPv4 address written in
decimal, octal or hex ("http://2130706433/", "http://0x7f.1/"): libc connects to 127.0.0.1 for those.
"""

from __future__ import annotations

import functools
import http.client
import ipaddress
import socket
import urllib.request
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SCHEMES = {"http": 80, "https": 443}
# Names the clouds give their instance metadata service; they resolve to link-local addresses inside the
# cloud, but a resolver may answer anything, so the names are refused by themselves too.
METADATA_HOSTS = frozenset({
    "metadata", "metadata.google.internal", "metadata.goog", "metadata.azure.com", "instance-data",
    "instance-data.ec2.internal", "metadata.tencentyun.com", "metadata.platformequinix.com",
})
# The metadata endpoints' own addresses: called out by name in the refusal so an operator sees the risk.
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "169.254.170.2", "100.100.100.200", "fd00:ec2::254"))
# Ranges that carry an IPv4 address inside an IPv6 one (NAT64 and the deprecated IPv4-compatible form);
# ipaddress unwraps ::ffff:a.b.c.d and 6to4 itself.
NAT64 = ipaddress.ip_network("64:ff9b::/96")
V4_COMPATIBLE = ipaddress.ip_network("::/96")
# Channel kinds whose config carries a URL (email goes to the operator's own SMTP server, from settings).
URL_KINDS = frozenset({"slack", "teams", "pagerduty", "opsgenie", "webhook"})


class RefusedURL(Exception):
    """A URL the guard will not connect to; `address` is the refused host or address, `reason` why."""

    def __init__(self, url: str, address: str, reason: str):
        super().__init__(f"{address}: {reason}")
        self.url, self.address, self.reason = url, address, reason


@dataclass(frozen=True)
class Target:
    """A checked URL: the host to name in TLS and Host, its port, and the addresses it may connect to."""

    host: str
    port: int
    addresses: tuple[str, ...]


# --- The allowlist ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Allowlist:
    """OUTBOUND_URL_ALLOWLIST parsed: host names or addresses (port None: any port) and networks."""

    hosts: frozenset[tuple[str, int | None]]
    networks: tuple[IPNetwork, ...]

    def names(self, host: str, port: int) -> bool:
        """Whether the URL's host (a name or an address) is allowed on this port."""
        host = host.lower()
        return (host, None) in self.hosts or (host, port) in self.hosts

    def covers(self, ip: IPAddress, port: int) -> bool:
        """Whether a resolved address is allowed: named itself, or inside an allowed network."""
        return self.names(str(ip), port) or any(ip in net for net in self.networks if net.version == ip.version)


def parse_allowlist_entry(entry: str) -> tuple[str, int | None] | IPNetwork:
    """"host", "host:port", "[v6]:port", "v6" or "a.b.c.d/nn" -> (host, port) or a network; ValueError if bad."""
    entry = entry.strip().lower()
    if "/" in entry:
        return ipaddress.ip_network(entry, strict=False)
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        port = rest.removeprefix(":")
        return str(ipaddress.ip_address(host)), (_port(port) if port else None)
    if entry.count(":") > 1:  # a bare IPv6 address
        return str(ipaddress.ip_address(entry)), None
    host, _, port = entry.partition(":")
    if not host:
        raise ValueError("no host")
    return host, (_port(port) if port else None)


def _port(text: str) -> int:
    port = int(text)
    if not 0 < port < 65536:
        raise ValueError(f"port {port} out of range")
    return port


@functools.lru_cache(maxsize=8)
def _allowlist(entries: tuple[str, ...]) -> Allowlist:
    hosts, networks = set(), []
    for entry in entries:
        parsed = parse_allowlist_entry(entry)
        (hosts.add if isinstance(parsed, tuple) else networks.append)(parsed)
    return Allowlist(frozenset(hosts), tuple(networks))


def allowlist() -> Allowlist:
    """The current setting (read each time so tests and `override_settings` take effect)."""
    raw = getattr(settings, "OUTBOUND_URL_ALLOWLIST", ())
    entries = raw.split(",") if isinstance(raw, str) else raw
    return _allowlist(tuple(e.strip() for e in entries if e and e.strip()))


# --- Checking ------------------------------------------------------------------------------------

def why_refused(ip: IPAddress) -> str | None:
    """Why an address is not a public one a webhook may live at, or None when it is."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = ip.ipv4_mapped or ip.sixtofour or _embedded_v4(ip)
        if inner is not None:
            why = why_refused(inner)
            return f"an IPv6 form of {inner}, which is {why}" if why else None
    if ip in METADATA_ADDRESSES:
        return "the cloud metadata endpoint"
    checks = (
        (ip.is_unspecified, "an unspecified"), (ip.is_loopback, "a loopback"),
        (ip.is_link_local, "a link-local"), (ip.is_multicast, "a multicast"),
        (ip.is_private, "a private"), (ip.is_reserved, "a reserved"),
    )
    for hit, what in checks:
        if hit:
            return f"{what} address"
    return None if ip.is_global else "not a globally routable address"


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip in NAT64 or (ip in V4_COMPATIBLE and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _literal(host: str) -> IPAddress | None:
    """The address a URL host spells, refusing IPv4 spellings other than a.b.c.d (libc reads 2130706433,
    0x7f.1 and 0177.0.0.1 as 127.0.0.1; a check that only knows dotted quads would wave them through)."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    try:
        packed = socket.inet_aton(host)
    except OSError:
        return None
    real = ipaddress.IPv4Address(packed)
    raise RefusedURL(host, host, f"an IPv4 address ({real}) written in a numeric form other than a.b.c.d")


def parse(url: str) -> tuple[str, int, IPAddress | None]:
    """(host, port, the address if the host is one) of an http(s) URL; RefusedURL if it cannot be one."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise RefusedURL(url, url, f"not a valid URL ({exc})") from None
    if parts.scheme.lower() not in SCHEMES:
        raise RefusedURL(url, parts.scheme or url, "only http and https URLs are allowed")
    if "@" in parts.netloc:
        raise RefusedURL(url, parts.netloc, "a URL with user@ or user:password@ is refused; put credentials "
                                            "in the channel's secret")
    host = (parts.hostname or "").rstrip(".").lower()
    if not host:
        raise RefusedURL(url, url, "the URL names no host")
    try:
        literal = _literal(host)
    except RefusedURL as exc:
        raise RefusedURL(url, exc.address, exc.reason) from None
    return host, port or SCHEMES[parts.scheme.lower()], literal


def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address the resolver gives for host (socket.gaierror, an OSError, when none)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: dict[str, IPAddress] = {}
    for *_, sockaddr in infos:
        seen.setdefault(sockaddr[0], ipaddress.ip_address(sockaddr[0].split("%")[0]))
    return list(seen.values())


def check_url(url: str) -> Target:
    """Resolve a URL's host and check every address; RefusedURL names the first one refused and why.
    DNS failure is an OSError (the caller decides: a form says so, a delivery retries)."""
    host, port, literal = parse(url)
    allowed = allowlist()
    if allowed.names(host, port):  # the operator vouched for this name, whatever it resolves to
        return Target(host, port, tuple(str(a) for a in ([literal] if literal else resolve(host, port))))
    if host in METADATA_HOSTS or host.endswith(".internal"):
        raise RefusedURL(url, host, "a cloud metadata or internal-only host name")
    addresses = [literal] if literal else resolve(host, port)
    for ip in addresses:
        why = why_refused(ip)
        if why and not allowed.covers(ip, port):
            shown = host if literal else f"{host} ({ip})"
            raise RefusedURL(url, str(ip), f"{shown} is {why}; OUTBOUND_URL_ALLOWLIST does not name it")
    return Target(host, port, tuple(str(a) for a in addresses))


def validate_url(url: str, field: str = "url") -> None:
    """check_url for forms and actions: a ValidationError keyed by `field` naming the address and why."""
    try:
        check_url(url)
    except RefusedURL as exc:
        raise ValidationError({field: f"refused {exc.url!r}: {exc.address}: {exc.reason}"},
                              code="refused_url") from None
    except OSError as exc:
        raise ValidationError({field: f"cannot resolve the host of {url!r}: {exc}"}, code="unresolvable") from None


def validate_channel(kind: str, config: dict | None, field: str = "config.url") -> None:
    """A channel's URL (if its kind has one and it is set; a missing URL is the transport's own error)."""
    url = (config or {}).get("url") if isinstance(config, dict) else None
    if kind in URL_KINDS and url:
        if not isinstance(url, str):
            raise ValidationError({field: f"must be a string URL, got {type(url).__name__}"}, code="invalid")
        validate_url(url, field)


# --- Sending -------------------------------------------------------------------------------------

def _connect_checked(addresses: tuple[str, ...], address: tuple, timeout=socket._GLOBAL_DEFAULT_TIMEOUT,
                     source_address=None) -> socket.socket:
    """Stands in for socket.create_connection: the port from http.client, the addresses from the check."""
    error: OSError | None = None
    for ip in addresses:
        try:
            return socket.create_connection((ip, address[1]), timeout, source_address)
        except OSError as exc:
            error = exc
    raise error or OSError("no address to connect to")


def _pinned(connection_class: type, target: Target):
    """A connection class for urllib's do_open that connects to the target's checked addresses. http.client
    keeps the host name for the Host header and (HTTPS) for SNI and the certificate check."""
    def make(host, **kwargs):
        conn = connection_class(host, **kwargs)
        # http.client's seam for how it opens the socket (an instance attribute since Python 3.0).
        conn._create_connection = functools.partial(_connect_checked, target.addresses)
        return conn
    return make


class GuardedHTTPHandler(urllib.request.HTTPHandler):
    """Plain HTTP to a checked address."""

    def http_open(self, req):
        return self.do_open(_pinned(http.client.HTTPConnection, check_url(req.full_url)), req)


class GuardedHTTPSHandler(urllib.request.HTTPSHandler):
    """HTTPS to a checked address, SNI and certificate checked against the URL's host name."""

    def https_open(self, req):
        return self.do_open(_pinned(http.client.HTTPSConnection, check_url(req.full_url)), req,
                            context=self._context)


def opener(*handlers, context=None) -> urllib.request.OpenerDirector:
    """A urllib opener whose every request passes the guard (RefusedURL raised before connecting); no
    proxies. `handlers` add to it (the transports add one refusing redirects); `context` is the TLS one."""
    return urllib.request.build_opener(urllib.request.ProxyHandler({}), GuardedHTTPHandler(),
                                       GuardedHTTPSHandler(context=context), *handlers)
