"""The hub connection through an HTTP proxy: ``CONNECT hub:port``, then TLS and the
WebSocket inside the tunnel.

Many corporate laptops reach the internet only through an HTTP proxy. The sidecar reads
the variables every HTTP client reads (curl, requests, GitHub's runner), once, at start:

* ``https_proxy`` / ``HTTPS_PROXY`` for a ``wss://`` hub, ``http_proxy`` / ``HTTP_PROXY``
  for ``ws://``; the lower-case name wins when both are set (curl, requests); an empty
  value is unset. ``ALL_PROXY`` and SOCKS are not read.
* The proxy URL is ``http://[user:password@]host[:port]`` (percent-encoded user and
  password; no scheme means ``http://``; no port means 80, as requests — curl says 1080:
  give it). ``https://`` (TLS to the proxy itself) and ``socks*://`` are refused at start.
* ``no_proxy`` / ``NO_PROXY`` (:func:`no_proxy_matches`): comma-separated entries, case
  and spaces ignored. ``*`` bypasses every host; ``name`` (or ``.name``, ``*.name``)
  matches that host and every host under it on a dot boundary (``example.com`` matches
  ``hub.example.com``, not ``badexample.com``); ``name:port`` only that port; an IP or a
  CIDR block (``10.0.0.0/8``) matches a hub URL naming an address in it (names are never
  resolved for this). Loopback is **not** exempt unless listed: curl and requests do not
  exempt it either, and corporate images already list ``localhost,127.0.0.1`` for them.

The exchange (RFC 9110 9.3.6): ``CONNECT host:port HTTP/1.1`` with ``Host`` and, with a
user, ``Proxy-Authorization: Basic``; any 2xx opens the tunnel; anything else is a
:class:`ProxyRefused` naming the proxy (:attr:`Proxy.label`: never its password) and the
status. The reply head is bounded (:data:`MAX_REPLY_BYTES`) and, with the TLS and
WebSocket handshakes after it, by the connector's ``connect_timeout_s``. Building the
request and parsing the reply are pure functions; :func:`open_tunnel` is the only I/O.
"""

from __future__ import annotations

import base64
import ipaddress
import urllib.parse
from collections.abc import Mapping

import attrs
import trio

from ._errors import ConnectFailed, ProxyRefused
from ._version import __version__

#: Largest proxy reply head (status line + headers) read before giving up, bytes.
MAX_REPLY_BYTES = 16384
#: The variables naming the proxy for each hub scheme, the winning one first.
PROXY_VARIABLES = {"ws": ("http_proxy", "HTTP_PROXY"), "wss": ("https_proxy", "HTTPS_PROXY")}
#: The variables listing hosts reached directly, the winning one first.
NO_PROXY_VARIABLES = ("no_proxy", "NO_PROXY")


@attrs.frozen(kw_only=True)
class Proxy:
    """An HTTP proxy for the hub connection.

    Attributes:
        host: the proxy's host name or address.
        port: its port.
        username: the Basic user ("" for none).
        password: the Basic password (never in ``repr`` or :attr:`label`).
        variable: where it came from (``HTTPS_PROXY`` ...), for the log lines.
    """

    host: str
    port: int
    username: str = ""
    password: str = attrs.field(default="", repr=False)
    variable: str = ""

    @property
    def label(self) -> str:
        """``http://alice:***@proxy.corp:3128``: the proxy as log lines name it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        user = f"{self.username}:***@" if self.username else ""
        return f"http://{user}{host}:{self.port}"

    @property
    def authorization(self) -> str | None:
        """The ``Proxy-Authorization`` value (Basic), or None without a user."""
        if not self.username:
            return None
        pair = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(pair).decode("ascii")


def parse_proxy_url(value: str, variable: str) -> Proxy:
    """The :class:`Proxy` a proxy variable's ``value`` names.

    Raises:
        ValueError: an unsupported scheme (https, socks), no host, a bad port; the
            message starts with ``variable`` and never quotes the password.
    """
    text = value.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urllib.parse.urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme == "https":
        raise ValueError(
            f"{variable}: an https:// proxy (TLS to the proxy) is not supported; "
            "use its http:// address (the hub connection stays TLS inside the tunnel)"
        )
    if scheme != "http":
        raise ValueError(f"{variable}: a {scheme}:// proxy is not supported (http:// only)")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0 or not parts.hostname:
        where = "no host" if not parts.hostname else "its port is not a number in 1-65535"
        raise ValueError(f"{variable}: the proxy URL has {where} (http://[user:pass@]host:port)")
    return Proxy(
        host=parts.hostname,
        port=port or 80,
        username=urllib.parse.unquote(parts.username or ""),
        password=urllib.parse.unquote(parts.password or ""),
        variable=variable,
    )


def _first(environ: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            return name, value
    return None


def proxy_from_env(url: str, environ: Mapping[str, str]) -> Proxy | None:
    """The proxy for the hub at ``url`` (ws/wss) under ``environ``, or None: direct.

    Raises:
        ValueError: the proxy variable names an unusable proxy (:func:`parse_proxy_url`).
    """
    parts = urllib.parse.urlsplit(url)
    found = _first(environ, PROXY_VARIABLES.get(parts.scheme, ()))
    if found is None:
        return None
    proxy = parse_proxy_url(found[1], found[0])
    port = parts.port or (443 if parts.scheme == "wss" else 80)
    if no_proxy_matches(parts.hostname or "", port, no_proxy_value(environ)):
        return None
    return proxy


def no_proxy_value(environ: Mapping[str, str]) -> str:
    """``no_proxy`` (else ``NO_PROXY``), or ""."""
    found = _first(environ, NO_PROXY_VARIABLES)
    return found[1] if found else ""


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return None


def no_proxy_matches(host: str, port: int, no_proxy: str) -> bool:
    """True if ``NO_PROXY``'s ``no_proxy`` exempts ``host:port`` (rules: module docstring)."""
    host = host.lower().strip("[]").rstrip(".")
    address = _address(host)
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if entry == "*":
            return True
        if not entry:
            continue
        if "/" in entry:  # a CIDR block
            try:
                if address is not None and address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        entry_port = ""
        if entry.startswith("["):  # [v6] or [v6]:port
            entry, _, after = entry[1:].partition("]")
            entry_port = after.removeprefix(":")
        elif entry.count(":") == 1:  # name:port or v4:port (a bare v6 has more colons)
            entry, _, entry_port = entry.partition(":")
        if entry_port and entry_port != str(port):
            continue
        if address is not None:
            if _address(entry) == address:
                return True
            continue
        entry = entry.removeprefix("*").lstrip(".").rstrip(".")
        if entry and (host == entry or host.endswith("." + entry)):
            return True
    return False


def _authority(host: str, port: int) -> str:
    """``host:port`` as the request line names it: an IPv6 address in brackets, a name
    in its ASCII (IDNA) form, the form DNS and the proxy see (a Unicode name could not
    be sent: latin-1 refused it, or sent ``ü`` as one raw byte)."""
    if ":" in host:
        return f"[{host}]:{port}"
    if not host.isascii():
        host = host.encode("idna").decode("ascii")
    return f"{host}:{port}"


def connect_request(host: str, port: int, *, authorization: str | None) -> bytes:
    """The ``CONNECT`` request head for ``host:port``."""
    target = _authority(host, port)
    lines = [
        f"CONNECT {target} HTTP/1.1",
        f"Host: {target}",
        f"User-Agent: deskbridge-sidecar/{__version__}",
    ]
    if authorization is not None:
        lines.append(f"Proxy-Authorization: {authorization}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


@attrs.frozen
class ConnectReply:
    """The proxy's reply head.

    Attributes:
        status: the HTTP status.
        reason: the reason phrase, as sent.
        headers: (lower-case name, value) pairs.
        rest: bytes after the head (a refusal's body; nothing after a 2xx).
    """

    status: int
    reason: str
    headers: tuple[tuple[str, str], ...]
    rest: bytes

    def header_values(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key == name]


def parse_connect_reply(data: bytes) -> ConnectReply | None:
    """The reply in ``data`` (what was received so far), or None if its head is not
    complete yet.

    Raises:
        ValueError: not an HTTP reply, or a head over :data:`MAX_REPLY_BYTES`.
    """
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        if len(data) > MAX_REPLY_BYTES:
            raise ValueError(f"a reply head over {MAX_REPLY_BYTES} bytes")
        return None
    if len(head) > MAX_REPLY_BYTES:
        raise ValueError(f"a reply head over {MAX_REPLY_BYTES} bytes")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    version, _, tail = status_line.partition(" ")
    code, _, reason = tail.partition(" ")
    if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise ValueError(f"not an HTTP reply: {_printable(status_line)!r}")
    headers = []
    for line in header_lines:
        name, colon, value = line.partition(":")
        if not colon or not name.strip():
            raise ValueError(f"a malformed header line: {_printable(line)!r}")
        headers.append((name.strip().lower(), value.strip()))
    return ConnectReply(int(code), reason.strip(), tuple(headers), rest)


def _printable(text: str, limit: int = 120) -> str:
    """The proxy's own words, safe for one log line: no control characters, bounded."""
    return "".join(c if c.isprintable() else "?" for c in text)[:limit]


async def open_tunnel(proxy: Proxy, host: str, port: int) -> trio.SocketStream:
    """A TCP stream to ``proxy`` on which ``CONNECT host:port`` succeeded: bytes sent on
    it reach the hub. The caller bounds it with a deadline (cancellation closes the
    stream).

    Raises:
        ProxyRefused: the proxy answered with a status other than 2xx.
        ConnectFailed: the proxy cannot be reached, closed, or did not speak HTTP.
    """
    where = f"proxy {proxy.label} ({proxy.variable})"
    try:
        stream = await trio.open_tcp_stream(proxy.host, proxy.port)
    except OSError as exc:
        raise ConnectFailed(f"cannot connect to {where}: {exc}") from None
    try:
        await stream.send_all(connect_request(host, port, authorization=proxy.authorization))
        data = b""
        while (reply := parse_connect_reply(data)) is None:
            chunk = await stream.receive_some(4096)
            if not chunk:
                raise ConnectFailed(f"{where} closed the connection before answering CONNECT")
            data += chunk
        if not 200 <= reply.status < 300:
            raise _refused(where, _authority(host, port), reply)
        if reply.rest:  # a client speaks first through a tunnel: nothing may be here yet
            raise ConnectFailed(f"{where} sent data before the hub could have")
        return stream
    except ValueError as exc:
        await trio.aclose_forcefully(stream)
        raise ConnectFailed(f"{where} answered CONNECT with {exc}") from None
    except (trio.BrokenResourceError, OSError) as exc:
        await trio.aclose_forcefully(stream)
        raise ConnectFailed(f"{where} broke the connection during CONNECT: {exc}") from None
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise


def _refused(where: str, target: str, reply: ConnectReply) -> ProxyRefused:
    said = f"HTTP {reply.status}" + (f" {_printable(reply.reason)}" if reply.reason else "")
    message = f"{where} refused CONNECT {target}: {said}"
    if reply.status == 407:
        schemes = "; ".join(_printable(v, 60) for v in reply.header_values("proxy-authenticate"))
        message += f" (it asks for {schemes})" if schemes else ""
        message += "; check the user and password in the proxy URL (Basic only)"
    return ProxyRefused(message, status_code=reply.status)


__all__ = [
    "MAX_REPLY_BYTES",
    "NO_PROXY_VARIABLES",
    "PROXY_VARIABLES",
    "ConnectReply",
    "Proxy",
    "connect_request",
    "no_proxy_matches",
    "no_proxy_value",
    "open_tunnel",
    "parse_connect_reply",
    "parse_proxy_url",
    "proxy_from_env",
]
