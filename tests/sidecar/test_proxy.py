"""The hub connection through an HTTP proxy (``CONNECT``): which proxy the environment
names, which hosts ``NO_PROXY`` exempts, the request and reply on the wire (no I/O), and
the real connector through a real proxy on loopback.

The real-socket tests run on the real clock, each under an absolute ``fail_after`` (as
``test_websocket.py``: the autojump clock would jump past real I/O waits).
"""

from __future__ import annotations

import base64
import functools
import os
import time
from pathlib import Path

import jwt
import pytest
import trio
from deskbridge_common import Timings
from deskbridge_sidecar import Daemon, _status, cli
from deskbridge_sidecar._errors import ConnectFailed, ProxyAuthFailed, ProxyRefused
from deskbridge_sidecar._proxy import (
    Proxy,
    connect_request,
    no_proxy_matches,
    parse_connect_reply,
    parse_proxy_url,
    proxy_from_env,
)
from deskbridge_sidecar._transport import WebSocketConnector, WebSocketSettings
from trio_websocket import WebSocketRequest, serve_websocket

from tests.integration.connect_proxy import ConnectProxy

DEADLINE_S = 10


# -- which proxy the environment names ---------------------------------------------------


def test_wss_uses_https_proxy_and_ws_uses_http_proxy() -> None:
    env = {"HTTPS_PROXY": "http://secure:3128", "HTTP_PROXY": "http://plain:8080"}
    wss = proxy_from_env("wss://hub.example/v1/sidecar", env)
    ws = proxy_from_env("ws://hub.example/v1/sidecar", env)
    assert wss is not None and (wss.host, wss.port, wss.variable) == ("secure", 3128, "HTTPS_PROXY")
    assert ws is not None and (ws.host, ws.port, ws.variable) == ("plain", 8080, "HTTP_PROXY")


def test_no_variable_means_direct_and_an_empty_one_counts_as_unset() -> None:
    assert proxy_from_env("wss://hub.example/v1/sidecar", {}) is None
    assert proxy_from_env("wss://hub.example/v1/sidecar", {"HTTPS_PROXY": "  "}) is None
    # the other scheme's variable is not used
    assert proxy_from_env("wss://hub.example/v1/sidecar", {"HTTP_PROXY": "http://p:1"}) is None


def test_the_lower_case_variable_wins_as_in_curl_and_requests() -> None:
    env = {"https_proxy": "http://lower:1", "HTTPS_PROXY": "http://upper:2"}
    proxy = proxy_from_env("wss://hub.example", env)
    assert proxy is not None and (proxy.host, proxy.variable) == ("lower", "https_proxy")


def test_no_proxy_exempts_the_hub_and_lower_case_wins() -> None:
    env = {"HTTPS_PROXY": "http://p:3128", "no_proxy": "hub.example", "NO_PROXY": "other"}
    assert proxy_from_env("wss://hub.example", env) is None
    assert proxy_from_env("wss://elsewhere.example", env) is not None


def test_proxy_url_forms() -> None:
    p = parse_proxy_url("http://al%40ice:p%3Ass@proxy.corp:3128/", "HTTPS_PROXY")
    assert (p.host, p.port, p.username, p.password) == ("proxy.corp", 3128, "al@ice", "p:ss")
    expected = "Basic " + base64.b64encode(b"al@ice:p:ss").decode()
    assert p.authorization == expected
    bare = parse_proxy_url("proxy.corp:3128", "HTTPS_PROXY")  # no scheme: http, as curl
    assert (bare.host, bare.port, bare.authorization) == ("proxy.corp", 3128, None)
    assert parse_proxy_url("http://proxy.corp", "HTTPS_PROXY").port == 80  # requests' default
    v6 = parse_proxy_url("http://[::1]:3128", "HTTPS_PROXY")
    assert (v6.host, v6.port) == ("::1", 3128)


def test_the_label_names_the_proxy_never_its_password() -> None:
    p = parse_proxy_url("http://alice:s3cret@proxy.corp:3128", "HTTPS_PROXY")
    assert p.label == "http://alice:***@proxy.corp:3128"
    assert "s3cret" not in repr(p) and "s3cret" not in str(p)
    assert parse_proxy_url("http://proxy.corp:3128", "HTTPS_PROXY").label == (
        "http://proxy.corp:3128"
    )


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("https://proxy.corp:3128", "https:// proxy (TLS to the proxy) is not supported"),
        ("socks5://proxy.corp:1080", "socks5:// proxy is not supported"),
        ("http://:3128", "no host"),
        ("http://proxy.corp:99999", "port"),
        ("http://proxy.corp:0", "port"),
    ],
)
def test_unusable_proxy_urls_are_refused_naming_the_variable_not_the_password(
    value: str, words: str
) -> None:
    with pytest.raises(ValueError) as info:
        parse_proxy_url(value.replace("://", "://bob:pw123@", 1), "HTTPS_PROXY")
    message = str(info.value)
    assert message.startswith("HTTPS_PROXY: ") and words in message, message
    assert "pw123" not in message


# -- NO_PROXY -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "port", "no_proxy", "bypass"),
    [
        ("hub.example.com", 443, "", False),
        ("hub.example.com", 443, "*", True),
        ("hub.example.com", 443, "other.org, *", True),
        ("hub.example.com", 443, "hub.example.com", True),
        ("HUB.Example.COM", 443, " hub.example.com ", True),  # case and spaces
        ("hub.example.com", 443, "example.com", True),  # a domain suffix on a dot
        ("hub.example.com", 443, ".example.com", True),  # leading dot: the same
        ("hub.example.com", 443, "*.example.com", True),
        ("example.com", 443, ".example.com", True),  # the domain itself too (curl)
        ("hub.badexample.com", 443, "example.com", False),  # not a label boundary
        ("hub.example.com", 443, "hub.example.com:443", True),  # host:port
        ("hub.example.com", 443, "hub.example.com:8443", False),  # another port
        ("10.1.2.3", 80, "10.1.2.3", True),
        ("10.1.2.3", 80, "10.0.0.0/8", True),  # CIDR (curl >= 7.86, requests)
        ("11.1.2.3", 80, "10.0.0.0/8", False),
        ("::1", 80, "::1", True),
        ("::1", 80, "[::1]:80", True),
        ("::1", 80, "::/0", True),
        ("127.0.0.1", 8080, "", False),  # loopback is not exempt unless listed (curl)
        ("localhost", 8080, "example.com", False),
        ("127.0.0.1", 8080, "localhost,127.0.0.1", True),
        ("hub.example.com", 443, ",,", False),
    ],
)
def test_no_proxy_matching(host: str, port: int, no_proxy: str, bypass: bool) -> None:
    assert no_proxy_matches(host, port, no_proxy) is bypass


# -- the CONNECT exchange, no I/O ---------------------------------------------------------


def test_connect_request_names_the_hub_in_the_request_line_and_host() -> None:
    wire = connect_request("hub.example", 443, authorization=None)
    assert wire.startswith(b"CONNECT hub.example:443 HTTP/1.1\r\nHost: hub.example:443\r\n")
    assert wire.endswith(b"\r\n\r\n") and b"Proxy-Authorization" not in wire
    v6 = connect_request("::1", 8443, authorization="Basic eDp5")
    assert v6.startswith(b"CONNECT [::1]:8443 HTTP/1.1\r\nHost: [::1]:8443\r\n")
    assert b"\r\nProxy-Authorization: Basic eDp5\r\n" in v6


def test_connect_request_names_an_international_hub_by_its_ascii_form() -> None:
    """A hub named in Unicode (reached directly: trio encodes the name for DNS) failed
    through a proxy with "proxy ... answered CONNECT with 'latin-1' codec can't
    encode", blamed on the proxy and retried for ever; ``bücher`` went out as one raw
    byte. The request line and ``Host`` carry the name's IDNA form, as DNS sees it."""
    wire = connect_request("例え.jp", 443, authorization=None)
    assert wire.startswith(b"CONNECT xn--r8jz45g.jp:443 HTTP/1.1\r\nHost: xn--r8jz45g.jp:443\r\n")
    assert connect_request("bücher.example", 80, authorization=None).startswith(
        b"CONNECT xn--bcher-kva.example:80 "
    )


def test_connect_reply_parsing() -> None:
    assert parse_connect_reply(b"HTTP/1.1 200 Connection established\r\n") is None  # more
    ok = parse_connect_reply(b"HTTP/1.1 200 Connection established\r\nVia: x\r\n\r\n")
    assert ok is not None and (ok.status, ok.reason, ok.rest) == (
        200,
        "Connection established",
        b"",
    )
    refused = parse_connect_reply(
        b"HTTP/1.0 407 Proxy Authentication Required\r\n"
        b'Proxy-Authenticate: Negotiate\r\nProxy-Authenticate: Basic realm="corp"\r\n\r\nbody'
    )
    assert refused is not None and refused.status == 407
    assert refused.header_values("proxy-authenticate") == ["Negotiate", 'Basic realm="corp"']
    assert refused.rest == b"body"


@pytest.mark.parametrize(
    "data",
    [
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",  # not HTTP
        b"HTTP/1.1 abc Nope\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    ],
)
def test_a_malformed_reply_is_an_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        parse_connect_reply(data)


def test_a_reply_head_is_bounded() -> None:
    with pytest.raises(ValueError, match="16384"):
        parse_connect_reply(b"HTTP/1.1 200 OK\r\n" + b"X: " + b"y" * 17000)


# -- the real connector through a real proxy ----------------------------------------------


async def _hub(request: WebSocketRequest) -> None:
    ws = await request.accept()
    await ws.send_message("hello through " + request.headers[0][0].decode())
    await trio.sleep_forever()


async def _serve_hub(nursery: trio.Nursery) -> int:
    serve = functools.partial(serve_websocket, _hub, "127.0.0.1", 0, ssl_context=None)
    server = await nursery.start(serve)
    return int(server.port)


def _proxy(port: int, *, user: str = "", password: str = "") -> Proxy:
    return Proxy(host="127.0.0.1", port=port, username=user, password=password, variable="T")


async def test_the_connector_tunnels_through_the_proxy() -> None:
    proxy = ConnectProxy(credentials=("alice", "s3cret"))
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            hub_port = await _serve_hub(nursery)
            await nursery.start(proxy.serve)
            connector = WebSocketConnector(
                proxy=_proxy(proxy.port, user="alice", password="s3cret")
            )
            url = f"ws://127.0.0.1:{hub_port}/v1/sidecar"
            async with connector.connect(url, [("Authorization", "Bearer t")]) as transport:
                assert (await transport.receive()).startswith("hello through")
            nursery.cancel_scope.cancel()
    assert proxy.tunnels == [f"127.0.0.1:{hub_port}"]
    assert b"GET /v1/sidecar HTTP/1.1" in proxy.relayed  # ws://: the proxy reads the upgrade


@pytest.mark.parametrize("status", [407, 403, 502])
async def test_a_refusal_names_the_proxy_and_status_never_the_password(status: int) -> None:
    if status == 407:
        proxy = ConnectProxy(credentials=("alice", "right"))
    else:
        proxy = ConnectProxy(refuse=status)
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.serve)
            connector = WebSocketConnector(proxy=_proxy(proxy.port, user="alice", password="wr0ng"))
            with pytest.raises(ProxyRefused) as info:
                async with connector.connect("wss://hub.example:443/v1/sidecar", []):
                    pass
            nursery.cancel_scope.cancel()
    exc = info.value
    assert isinstance(exc, ConnectFailed) and exc.status_code == status
    message = str(exc)
    assert f"proxy http://alice:***@127.0.0.1:{proxy.port} (T)" in message, message
    assert "CONNECT hub.example:443" in message and f"HTTP {status}" in message, message
    assert "wr0ng" not in message and "\n" not in message
    if status == 407:
        assert 'it asks for Basic realm="test"' in message, message
    assert proxy.tunnels == []


async def test_a_silent_proxy_fails_within_the_connect_timeout() -> None:
    proxy = ConnectProxy(silent=True)
    settings = WebSocketSettings(connect_timeout_s=0.5)
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.serve)
            connector = WebSocketConnector(proxy=_proxy(proxy.port), settings=settings)
            with pytest.raises(
                ConnectFailed, match="through proxy http://127.0.0.1:.* within 0.5 s"
            ):
                async with connector.connect("ws://hub.example:80/v1/sidecar", []):
                    pass
            nursery.cancel_scope.cancel()


async def test_an_unreachable_proxy_is_named() -> None:
    with trio.socket.socket() as s:  # a free port nobody listens on
        await s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    connector = WebSocketConnector(proxy=_proxy(port))
    with trio.fail_after(DEADLINE_S), pytest.raises(ConnectFailed) as info:
        async with connector.connect("ws://hub.example:80/v1/sidecar", []):
            pass
    assert f"cannot connect to proxy http://127.0.0.1:{port} (T)" in str(info.value)


# -- the daemon: a refusal is retried, 407 stops --------------------------------------------


def _daemon(proxy_port: int, **kwargs: object) -> Daemon:
    timings = Timings(backoff_initial_s=0.01, backoff_max_s=0.02)
    proxy = _proxy(proxy_port, user="alice", password="wr0ng")
    return Daemon("ws://hub.example:80", "real-token", timings=timings, proxy=proxy, **kwargs)  # type: ignore[arg-type]


async def test_the_daemon_retries_a_refusal_with_backoff() -> None:
    proxy = ConnectProxy(refuse=502)
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.serve)
            daemon = _daemon(proxy.port)
            nursery.start_soon(daemon.run)
            await proxy.wait_refused(3)
            assert daemon.statistics().last_end is not None
            assert "HTTP 502" in daemon.statistics().last_end.reason
            nursery.cancel_scope.cancel()


async def test_the_daemon_stops_on_407_after_one_attempt() -> None:
    proxy = ConnectProxy(credentials=("alice", "right"))
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.serve)
            with pytest.raises(ProxyAuthFailed, match="HTTP 407") as info:
                await _daemon(proxy.port).run()
            nursery.cancel_scope.cancel()
    assert proxy.refused == [407] and "wr0ng" not in str(info.value)


# -- the CLI: the environment, --no-proxy, the status line ---------------------------------


TOKEN_JWT = jwt.encode({"sub": "alice", "exp": int(time.time()) + 3600}, "s" * 32)


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith("DESKBRIDGE_") or name.lower() in ("https_proxy", "no_proxy"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("DESKBRIDGE_NO_KEYRING", "1")
    monkeypatch.setenv("DESKBRIDGE_DATA_DIR", str(tmp_path / "data"))
    return monkeypatch


def _built(argv: list[str]) -> Daemon:
    parser, run_parser = cli._build_parsers()
    return cli._daemon_from_args(run_parser, parser.parse_args(argv))


def test_the_cli_takes_the_proxy_from_the_environment_unless_no_proxy(
    cli_env: pytest.MonkeyPatch,
) -> None:
    cli_env.setenv("HTTPS_PROXY", "http://bob:pw@proxy.corp:3128")
    run = ["run", "--hub", "wss://hub.example", "--token", TOKEN_JWT]
    daemon = _built(run)
    assert daemon.proxy is not None and daemon.proxy.label == "http://bob:***@proxy.corp:3128"
    assert _built([*run, "--no-proxy"]).proxy is None
    cli_env.setenv("NO_PROXY", "ub.example")
    assert _built(run).proxy is not None  # not a suffix on a dot boundary
    cli_env.setenv("NO_PROXY", ".example")
    assert _built(run).proxy is None


def test_an_unusable_proxy_is_a_usage_error_without_the_password(
    cli_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cli_env.setattr(cli, "_serve", None)  # must never be reached
    cli_env.setenv("https_proxy", "https://bob:pw123@proxy.corp:3128")
    assert cli.main(["run", "--hub", "wss://hub.example", "--token", TOKEN_JWT]) == 2
    err = capsys.readouterr().err
    assert "https_proxy: an https:// proxy (TLS to the proxy) is not supported" in err, err
    assert "pw123" not in err


def test_status_says_through_which_proxy(tmp_path: Path) -> None:
    body = {
        "pid": os.getpid(),
        "hub": "wss://hub.example/v1/sidecar",
        "proxy": "http://bob:***@proxy.corp:3128",
        "connected": True,
        "session_id": "s1",
        "since": time.time(),
        "updated_at": time.time(),
    }
    _status.write(tmp_path / "status.json", body)
    code, text = _status.report(tmp_path / "status.json")
    assert code == 0
    hub = "wss://hub.example/v1/sidecar"
    assert f"connected to {hub} through proxy http://bob:***@proxy.corp:3128" in text
