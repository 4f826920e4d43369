"""The browser's only way out: a SOCKS5 proxy on loopback that opens a connection only to
a host and port on the allow-list.

Playwright's request route sees the first request of a redirect chain, not the requests
its redirects make, and sees no WebSocket at all. The browser is therefore started with
this proxy as its proxy for everything (``--proxy-server=socks5://127.0.0.1:PORT``, no
bypass, not even loopback), so every TCP connection its network stack opens, whatever
asked for it (a redirect at any hop, a sub-resource, a worker, a WebSocket, a popup, a
frame), is a SOCKS ``CONNECT`` checked here before any byte reaches the host. The proxy
relays bytes and nothing else: cookies, ``SameSite``, TLS and its certificate checks stay
the browser's own. SOCKS5 carries the host *name* (the browser resolves nothing itself:
``--host-resolver-rules`` maps every name to "not found"), so the name checked is the name
connected to.

A ``CONNECT`` names a host and a port, not a scheme: it is allowed when ``http://`` or
``https://`` of that host and port is on the allow-list (a WebSocket to an allowed origin
is the same host and port). Anything else is refused with SOCKS reply 2 ("not allowed by
ruleset"); the browser fails that request (``ERR_SOCKS_CONNECTION_FAILED``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from ._origins import OriginPolicy

log = logging.getLogger("deskbridge.sidecar.browser")

#: Longest a client may take to name its destination, seconds.
HANDSHAKE_S = 10.0
#: Longest a connection to an allowed host may take to open, seconds.
CONNECT_S = 30.0
_CHUNK = 65536
# SOCKS5 reply codes (RFC 1928 section 6).
_OK, _FAILURE, _NOT_ALLOWED, _UNREACHABLE, _REFUSED, _NO_COMMAND, _NO_ADDRESS = 0, 1, 2, 4, 5, 7, 8


def authority_allowed(policy: OriginPolicy, host: str, port: int) -> bool:
    """True when ``http://host:port`` or ``https://host:port`` is an allowed origin.

    ``host`` is a name or an IP address as a SOCKS client sends it; one that does not
    read back as the same host from a URL (``/``, ``@``, ``\\``, spaces...) is refused.
    """
    try:
        literal: str = str(ipaddress.ip_address(host))
        authority = f"[{literal}]" if ":" in literal else literal
    except ValueError:
        literal = host.lower()
        authority = literal
    for scheme in ("http", "https"):
        url = f"{scheme}://{authority}:{port}/"
        try:
            parsed = urlsplit(url).hostname
        except ValueError:
            return False
        if parsed != literal:
            return False
        if policy.allows(url):
            return True
    return False


class AllowListSocks:
    """A SOCKS5 ``CONNECT`` proxy (no authentication) on ``127.0.0.1``, for one browser.

    Args:
        policy: the allow-list.
        on_blocked: called with ``"host:port"`` for each refused connection (on the loop).

    Runs on the asyncio loop that calls :meth:`start`; :meth:`close` stops listening and
    cuts every relayed connection.
    """

    def __init__(self, policy: OriginPolicy, on_blocked: Callable[[str], None]):
        self.policy = policy
        self.on_blocked = on_blocked
        self.port = 0
        #: Connections relayed so far (allowed ones).
        self.relayed = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        """Listen on an ephemeral loopback port; return it."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        """Stop listening and close every connection (relayed or not)."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        upstream: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(HANDSHAKE_S + CONNECT_S):
                opened = await self._handshake(reader, writer)
            if opened is not None:
                up_reader, upstream = opened
                self._writers.add(upstream)
                self.relayed += 1
                await asyncio.gather(_pump(reader, upstream), _pump(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError, TimeoutError, UnicodeDecodeError):
            pass
        finally:
            for w in (writer, upstream):
                if w is not None:
                    self._writers.discard(w)
                    w.close()

    async def _handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        version, count = await reader.readexactly(2)
        methods = await reader.readexactly(count)
        if version != 5 or 0 not in methods:
            writer.write(b"\x05\xff")
            return None
        writer.write(b"\x05\x00")
        version, command, _, kind = await reader.readexactly(4)
        if kind == 1:
            host = socket.inet_ntop(socket.AF_INET, await reader.readexactly(4))
        elif kind == 4:
            host = socket.inet_ntop(socket.AF_INET6, await reader.readexactly(16))
        elif kind == 3:
            host = (await reader.readexactly((await reader.readexactly(1))[0])).decode("ascii")
        else:
            _reply(writer, _NO_ADDRESS)
            return None
        port = int.from_bytes(await reader.readexactly(2), "big")
        if version != 5 or command != 1:
            _reply(writer, _NO_COMMAND)
            return None
        if not authority_allowed(self.policy, host, port):
            where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            log.warning("browser: blocked a connection to %s (not an allowed origin)", where)
            self.on_blocked(where)
            _reply(writer, _NOT_ALLOWED)
            return None
        try:
            async with asyncio.timeout(CONNECT_S):
                opened = await asyncio.open_connection(host, port)
        except ConnectionRefusedError:
            _reply(writer, _REFUSED)
            return None
        except (OSError, TimeoutError):
            _reply(writer, _UNREACHABLE)
            return None
        _reply(writer, _OK)
        return opened


def proxy_args(port: int) -> list[str]:
    """Flags that make the allow-list proxy  on ``port`` the browser's
    only way out, given after every other flag (the last of a repeated flag wins): no
    proxy bypass, not even for loopback; no name resolved by the browser itself (a DNS
    prefetch would leak a name); no QUIC; WebRTC only through the proxy (no direct UDP)."""
    return [
        f"--proxy-server=socks5://127.0.0.1:{port}",
        "--proxy-bypass-list=<-loopback>",
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
        "--disable-quic",
        "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
    ]


def blocked_report(entries: Sequence[str]) -> list[str]:
    """A browser tool's ``blocked`` list: each URL the route aborted, then each
    ``host:port`` the proxy refused that no such URL names (a preconnect to a link's host
    is the same destination as the click), each once, in order."""
    named = set()
    for entry in entries:
        with contextlib.suppress(ValueError):
            parts = urlsplit(entry)
            host = parts.hostname or ""
            port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
            named.add(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    report: list[str] = []
    for entry in entries:
        if entry not in report and ("://" in entry or entry not in named):
            report.append(entry)
    return report


def _reply(writer: asyncio.StreamWriter, code: int) -> None:
    writer.write(bytes([5, code, 0, 1, 0, 0, 0, 0, 0, 0]))


async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(_CHUNK):
            dst.write(data)
            await dst.drain()
        if dst.can_write_eof():
            dst.write_eof()
    except OSError:
        dst.close()


__all__ = ["AllowListSocks", "authority_allowed", "blocked_report", "proxy_args"]
