"""A peer holding a valid token for its own user must not make the hub process hold memory
it never asked for: real ``deskbridge-hub serve --workers 1`` (Hypercorn, wsproto), a raw
hostile client, and a well-behaved second user's real sidecar that keeps answering.

The hub's resident size is read from /proc while the attack runs (its peak), so a defect
shows as growth in proportion to what the attacker sent; the bounds leave room for the
ordinary noise of a Python process (tens of MiB) and are far below the attacks' sizes.
"""

from __future__ import annotations

import secrets
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from tests.integration import hostile_ws as ws
from tests.procs import Hub, Sidecar, api, issue, running, wait_until

pytestmark = pytest.mark.integration

#: Short liveness, so a hostile socket that never answers the close is ended within the test.
TIMINGS = {"DESKBRIDGE_PING_INTERVAL_S": "3", "DESKBRIDGE_PING_TIMEOUT_S": "3"}


class PeakRss:
    """Samples a process's resident size every 20 ms while in use; ``peak`` in MiB."""

    def __init__(self, pid: int):
        self.pid = pid
        self.peak = ws.rss_mb(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, ws.rss_mb(self.pid))

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def hub_and_good_user(tmp_path) -> Iterator[tuple[Hub, str]]:
    hub = Hub(tmp_path, workers=1, env=TIMINGS)
    with running(hub):
        hub.wait_healthy()
        good = "good-" + secrets.token_hex(4)
        sidecar = Sidecar(tmp_path, hub.ws, issue(good))
        with running(sidecar), api() as client:
            wait_until(
                lambda: client.get(f"{hub.http}/v1/users/{good}/presence").json()["online"],
                timeout_s=20,
                what="the good user online",
            )
            yield hub, good


def _echo_works(hub: Hub, user: str) -> None:
    with api() as client:
        for i in range(3):
            answer = client.post(
                f"{hub.http}/v1/users/{user}/jobs",
                json={"name": "echo", "args": {"i": i}, "timeout_s": 10},
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["result"] == {"i": i}


def _welcomed(sock) -> None:
    sock.sendall(ws.frame(ws.HELLO.encode()))
    sock.settimeout(10)
    assert b"welcome" in sock.recv(65536)


def test_permessage_deflate_is_declined_and_a_compressed_bomb_is_not_inflated(
    hub_and_good_user,
):
    """Before: the hub accepted permessage-deflate and inflated each received chunk with
    no limit: a 200 KB frame inflating to 200 MB took a worker from 75 MB to 400 MB."""
    hub, good = hub_and_good_user
    evil = "evil-" + secrets.token_hex(4)
    sock, head = ws.connect(hub.port, issue(evil), offer_deflate=True)
    with sock:
        assert "sec-websocket-extensions" not in head.lower(), head
        _welcomed(sock)
        bomb = ws.frame(ws.deflated(64 << 20), rsv1=True)  # ~64 KB inflating to 64 MiB
        before = ws.rss_mb(hub.pid)
        with PeakRss(hub.pid) as rss:
            sock.sendall(bomb)
            code, _reason, _ended = ws.read_until_close(sock, 10)
        assert code == 1002  # a compressed frame without the extension: protocol error
        assert rss.peak - before < 24, (before, rss.peak)
    _echo_works(hub, good)


def test_bytes_after_an_oversized_message_are_dropped_not_buffered(hub_and_good_user):
    """Before: after closing 1009 for a message over the transport's cap, Hypercorn kept
    appending every later chunk to that message's buffer for as long as the peer sent:
    100 MB sent after the 1009 took a worker from 75 MB to 231 MB."""
    hub, good = hub_and_good_user
    evil = "evil-" + secrets.token_hex(4)
    sock, _head = ws.connect(hub.port, issue(evil))
    with sock:
        _welcomed(sock)
        chunk = ws.frame(b"a" * 65536, opcode=0, fin=False)
        before = ws.rss_mb(hub.pid)
        sent = 0
        with PeakRss(hub.pid) as rss:
            try:
                sock.sendall(ws.frame(b'{"type": "ping", "nonce": "' + b"a" * (3 << 20), fin=False))
                while sent < 64 << 20:  # 64 MiB of continuation that never ends
                    sock.sendall(chunk)
                    sent += len(chunk)
            except OSError:
                pass  # the hub may end the socket (liveness) before all of it is sent
            code, _reason, ended = ws.read_until_close(sock, 30)
        assert code == 1009
        assert sent >= 32 << 20, sent  # the peer could keep sending after the 1009
        assert rss.peak - before < 24, (before, rss.peak, sent)
        # the peer never answered the close: the session's liveness ends the connection
        assert ended
    _echo_works(hub, good)


def test_a_frame_wsproto_refuses_is_answered_with_a_close_frame_naming_why(hub_and_good_user):
    """Before: wsproto's own refusals (invalid UTF-8, reserved bits, an unknown opcode, a
    control frame over 125 bytes) ended the TCP connection without a close frame: the
    peer learnt neither the code nor the reason."""
    hub, good = hub_and_good_user
    evil = "evil-" + secrets.token_hex(4)
    cases = {
        "invalid UTF-8": (ws.frame(b'{"type": "\xff"}'), 1007),
        "a reserved bit": (ws.frame(b"{}", rsv1=True), 1002),
        "an unknown opcode": (ws.frame(b"{}", opcode=3), 1002),
        "a ping over 125 bytes": (ws.frame(b"p" * 126, opcode=9), 1002),
    }
    for what, (bad, expected) in cases.items():
        sock, _head = ws.connect(hub.port, issue(evil))
        with sock:
            _welcomed(sock)
            sock.sendall(bad)
            code, reason, ended = ws.read_until_close(sock, 10)
        assert (code, bool(reason), ended) == (expected, True, True), (what, code, reason)
    _echo_works(hub, good)


def test_sockets_that_leave_an_unfinished_message_do_not_pile_up(hub_and_good_user):
    """Before: an ended session stayed referenced by the hub's timer heaps until its next
    planned visit (up to ~35 s), and through its socket Hypercorn's stream with the
    unfinished message in its buffer: 60 sockets leaving 1.5 MB each took a real hub from
    74 MB to 163 MB, so one token reconnecting fast held memory in proportion to its rate.
    A token each: one user's handshakes are paced (``_handshake_pace``: 10 at once, then 1
    a second; the 11th of one token is refused 429), and sockets of many users hold memory
    the same way."""
    hub, good = hub_and_good_user
    unfinished = ws.frame(b'{"type": "ping", "nonce": "' + b"a" * 1_500_000, fin=False)
    before = ws.rss_mb(hub.pid)
    for _round in range(4):
        for _ in range(15):
            sock, _head = ws.connect(hub.port, issue("evil-" + secrets.token_hex(4)))
            with sock:
                sock.sendall(ws.frame(ws.HELLO.encode()))
                sock.sendall(unfinished)
                ws.read_until_close(sock, 0.05)  # let the hub take it in
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        time.sleep(0.5)  # the hub sees the resets; its sessions end
    grown = ws.rss_mb(hub.pid) - before
    assert grown < 40, grown  # 60 x 1.5 MB = 90 MB when every one is kept
    _echo_works(hub, good)


def test_a_message_over_the_transport_cap_is_closed_1009_with_a_reason_naming_it(
    hub_and_good_user,
):
    """Before: Hypercorn closed with 1009 and no reason, so the peer (and its log) could
    not tell which limit it crossed."""
    hub, good = hub_and_good_user
    sock, _head = ws.connect(hub.port, issue("evil-" + secrets.token_hex(4)))
    with sock:
        _welcomed(sock)
        try:
            sock.sendall(ws.frame(b'{"type": "ping", "nonce": "' + b"a" * (2 << 20) + b'"}'))
        except OSError:
            pass  # the hub may close before it has read all of it
        code, reason, _ended = ws.read_until_close(sock, 10)
    assert code == 1009
    assert reason.startswith("message over 2 MiB"), reason
    _echo_works(hub, good)
