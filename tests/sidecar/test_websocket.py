"""The real transport: trio-websocket on loopback, port 0, real clock.

Policy (after trio-websocket's own tests): loopback only, port 0, an absolute
``fail_after`` on every test. These tests do not use the autojump clock: it would jump
past real I/O waits and fire the connect timeout at once.
"""

from __future__ import annotations

import functools
import ssl

import pytest
import trio
import trustme
from deskbridge_common import Hello, Job, JobResult, Welcome, decode_frame, encode_frame
from deskbridge_sidecar import (
    ConnectFailed,
    Daemon,
    TokenRefused,
    WebSocketConnector,
    WebSocketSettings,
    run_daemon,
)
from deskbridge_sidecar.cli import make_ssl_context
from trio_websocket import (
    ConnectionClosed,
    WebSocketConnection,
    WebSocketRequest,
    serve_websocket,
)

TOKEN = "real-token"
DEADLINE_S = 10


def _welcome(session_id: str) -> str:
    return encode_frame(
        Welcome(session_id=session_id, heartbeat_s=10, ping_interval_s=10, ping_timeout_s=10)
    )


def _job(delivery_id: str, key: str) -> str:
    return encode_frame(
        Job(
            id=delivery_id,
            job_id="job-1",
            name="echo",
            args={"n": 1},
            idempotency_key=key,
            deadline=4_000_000_000.0,
        )
    )


class TinyHub:
    """Just enough hub: checks the bearer token, welcomes, sends one echo job per
    connection, records what comes back, then closes with 1012 the first time."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.hellos: list[Hello] = []
        self.results: list[JobResult] = []
        self.connections = 0
        self.second_result = trio.Event()
        self.closed_with: tuple[int, str | None] | None = None
        self.closed = trio.Event()

    async def handle(self, request: WebSocketRequest) -> None:
        headers = {k.lower(): v for k, v in request.headers}
        if headers.get(b"authorization") != f"Bearer {TOKEN}".encode():
            await request.reject(401)
            return
        self.paths.append(request.path)
        ws = await request.accept()
        self.connections += 1
        try:
            await self._serve_one(ws, self.connections)
        except ConnectionClosed as exc:
            self.closed_with = (exc.reason.code, exc.reason.reason)
            self.closed.set()

    async def _serve_one(self, ws: WebSocketConnection, n: int) -> None:
        self.hellos.append(decode_frame(await ws.get_message()))
        await ws.send_message(_welcome(f"real-{n}"))
        await ws.send_message(_job(f"d-{n}", key="same-key"))
        while True:
            frame = decode_frame(await ws.get_message())
            if isinstance(frame, JobResult):
                self.results.append(frame)
                break
        if n == 1:
            await ws.aclose(1012, "hub restarting")
            return
        self.second_result.set()
        while True:  # keep reading so the sidecar's close handshake completes
            await ws.get_message()


async def _serve(nursery: trio.Nursery, hub: TinyHub, ssl_context=None) -> int:
    server = await nursery.start(
        functools.partial(serve_websocket, hub.handle, "127.0.0.1", 0, ssl_context=ssl_context)
    )
    return server.port


async def test_round_trip_over_a_real_socket_and_reconnect_on_1012(nursery):
    with trio.fail_after(DEADLINE_S):
        hub = TinyHub()
        port = await _serve(nursery, hub)
        daemon = Daemon(f"ws://127.0.0.1:{port}", TOKEN, random=lambda: 0.0)
        first_session = await nursery.start(daemon.run)
        assert first_session == "real-1"
        await hub.second_result.wait()
        assert hub.paths == ["/v1/sidecar", "/v1/sidecar"]
        assert [t.name for t in hub.hellos[0].tools] == ["status", "echo", "sleep"]
        assert [(r.id, r.ok, r.result) for r in hub.results] == [
            ("d-1", True, {"n": 1}),
            ("d-2", True, {"n": 1}),  # same key: answered from the cache, new id
        ]
        stats = daemon.statistics()
        assert stats.executions == {"echo": 1} and stats.sessions_started == 2
        assert stats.last_end.code == 1012
        daemon.stop()
        await hub.closed.wait()
        assert hub.closed_with == (1001, "sidecar stopping")


async def test_http_401_stops_the_daemon(nursery):
    with trio.fail_after(DEADLINE_S):
        port = await _serve(nursery, TinyHub())
        daemon = Daemon(f"ws://127.0.0.1:{port}", "wrong-token")
        with pytest.raises(TokenRefused) as info:
            await daemon.run()
        assert info.value.status_code == 401


async def test_nothing_listening_is_a_connect_failure(nursery):
    with trio.fail_after(DEADLINE_S):
        listener = trio.socket.socket()
        await listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        listener.close()  # the port is free and nothing listens on it
        connector = WebSocketConnector()
        with pytest.raises(ConnectFailed):
            async with connector.connect(f"ws://127.0.0.1:{port}/v1/sidecar", []):
                pytest.fail("connected to nothing")


@pytest.fixture
def tls(tmp_path):
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    return server_context, str(ca_file)


async def test_wss_with_a_ca_file(nursery, tls):
    server_context, ca_file = tls
    with trio.fail_after(DEADLINE_S):
        hub = TinyHub()
        port = await _serve(nursery, hub, ssl_context=server_context)
        daemon = Daemon(f"wss://127.0.0.1:{port}", TOKEN, ssl_context=make_ssl_context(ca_file))
        assert await nursery.start(daemon.run) == "real-1"
        daemon.stop()


async def test_wss_with_an_untrusted_certificate_fails_to_connect(nursery, tls):
    server_context, _ = tls
    with trio.fail_after(DEADLINE_S):
        port = await _serve(nursery, TinyHub(), ssl_context=server_context)
        connector = WebSocketConnector(
            ssl_context=make_ssl_context(None),  # the system store does not know this CA
            settings=WebSocketSettings(connect_timeout_s=1.0),
        )
        with pytest.raises(ConnectFailed, match="TLS handshake .* failed: .*CERTIFICATE_VERIFY"):
            async with connector.connect(f"wss://127.0.0.1:{port}/v1/sidecar", []):
                pytest.fail("trusted a certificate from an unknown CA")


async def test_a_server_that_never_upgrades_times_out(nursery):
    async def silent(stream: trio.SocketStream) -> None:
        async with stream:
            await trio.sleep_forever()

    with trio.fail_after(DEADLINE_S):
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, silent, 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        connector = WebSocketConnector(settings=WebSocketSettings(connect_timeout_s=0.3))
        with pytest.raises(ConnectFailed, match="no WebSocket upgrade .* within 0.3 s"):
            async with connector.connect(f"ws://127.0.0.1:{port}/v1/sidecar", []):
                pytest.fail("upgraded by a silent server")


async def test_run_daemon_until_its_scope_is_cancelled(nursery):
    with trio.fail_after(DEADLINE_S):
        hub = TinyHub()
        port = await _serve(nursery, hub)
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as inner:
                run = functools.partial(run_daemon, f"ws://127.0.0.1:{port}", TOKEN)
                assert await inner.start(run) == "real-1"
                scope.cancel()
        await hub.closed.wait()
        assert hub.closed_with == (1001, "sidecar stopping")


async def test_a_message_over_the_sidecars_limit_is_closed_1009_with_a_reason_naming_it(
    nursery,
):
    """The other direction of the hub's transport cap: a message from the hub over
    ``MAX_FRAME_BYTES`` characters is refused by trio-websocket before the codec, with
    1009 and a reason that names the limit, both to the hub and to the session."""
    from deskbridge_common import MAX_FRAME_BYTES
    from deskbridge_sidecar import TransportClosed

    hub_saw: list[tuple[int, str | None]] = []
    done = trio.Event()

    async def oversized(request: WebSocketRequest) -> None:
        ws = await request.accept()
        try:
            await ws.send_message("a" * (MAX_FRAME_BYTES + 1))
            await ws.get_message()
        except ConnectionClosed as exc:
            hub_saw.append((exc.reason.code, exc.reason.reason))
        finally:
            done.set()

    with trio.fail_after(DEADLINE_S):
        server = await nursery.start(
            functools.partial(serve_websocket, oversized, "127.0.0.1", 0, ssl_context=None)
        )
        url = f"ws://127.0.0.1:{server.port}/v1/sidecar"
        async with WebSocketConnector().connect(url, []) as transport:
            with pytest.raises(TransportClosed) as closed:
                await transport.receive()
        await done.wait()
    assert closed.value.code == 1009 and str(MAX_FRAME_BYTES) in closed.value.reason
    assert hub_saw == [(1009, closed.value.reason)]
