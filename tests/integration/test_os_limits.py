"""A hub process near its file-descriptor limit: real ``deskbridge-hub serve --workers 1``
under ``prlimit --nofile`` (a hub started with a low ``ulimit -n``), raw TCP clients.

What must hold: a connection whose client goes away gives its descriptor back at once
(not after Hypercorn's 75 s keep-alive timeout), so a burst of connections that never
send a request cannot keep the process at its limit; at the limit ``accept`` fails with
EMFILE and the process neither spins a core nor crashes, nor writes a traceback ten
times a second; once descriptors free it serves again.
"""

from __future__ import annotations

import os
import shutil
import socket
import time

import httpx
import pytest

from tests.procs import Hub, log_text, running, wait_until

pytestmark = pytest.mark.integration

#: The hub's descriptor limit in the EMFILE test: room for the interpreter, Redis
#: connections and the listener, and a few dozen client connections.
NOFILE = 64


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _silent_connections(port: int, count: int) -> list[socket.socket]:
    """``count`` TCP connections to the hub that send nothing (a load balancer's TCP
    check, a port scan, a client that gave up before its request)."""
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        socks.append(s)
    return socks


def _healthy(hub: Hub) -> bool:
    try:
        return httpx.get(hub.http + "/healthz", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_connection_closed_before_its_request_frees_its_descriptor_at_once(tmp_path):
    """Before: Hypercorn kept the socket of a client that closed without sending a request
    (CLOSE-WAIT) until its keep-alive timeout, 75 s: 40 such connections held 40
    descriptors for 75 s."""
    hub = Hub(tmp_path, workers=1)
    with running(hub):
        hub.wait_healthy()
        baseline = _fds(hub.pid)
        socks = _silent_connections(hub.port, 40)
        wait_until(lambda: _fds(hub.pid) >= baseline + 35, timeout_s=10, what="all accepted")
        for s in socks:
            s.close()
        wait_until(
            lambda: _fds(hub.pid) <= baseline + 3,
            timeout_s=5,
            what=f"the hub's descriptors back near {baseline} (now {_fds(hub.pid)})",
        )


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
def test_at_its_descriptor_limit_the_hub_neither_spins_nor_floods_and_recovers(tmp_path):
    """At ``ulimit -n 64`` with every descriptor taken by silent connections: accept fails
    with EMFILE. The process must stay up, idle (trio retries accept every 0.1 s), log the
    condition a bounded number of times (before: an ERROR with a traceback every 0.1 s),
    and serve again within seconds of the clients going (before: 75 s per backlog's worth
    of dead connections)."""
    hub = Hub(tmp_path, workers=1, prefix=("prlimit", f"--nofile={NOFILE}:{NOFILE}", "--"))
    with running(hub):
        hub.wait_healthy()
        socks = _silent_connections(hub.port, NOFILE + 20)  # the rest wait in the backlog
        try:
            wait_until(
                lambda: "EMFILE" in log_text(hub) or "Too many open files" in log_text(hub),
                timeout_s=10,
                what="accept failing with EMFILE",
            )
            cpu0, t0 = _cpu_s(hub.pid), time.monotonic()
            time.sleep(3)
            busy = (_cpu_s(hub.pid) - cpu0) / (time.monotonic() - t0)
            assert busy < 0.3, f"the hub used {busy:.2f} of a core while at its limit"
            assert hub.popen.poll() is None
            text = log_text(hub)
            floods = text.count("Too many open files")
            assert floods <= 3, f"{floods} log lines about EMFILE in ~3 s:\n{text[-2000:]}"
        finally:
            for s in socks:
                s.close()
        wait_until(lambda: _healthy(hub), timeout_s=10, what="the hub serving again")
        assert "descriptors" in log_text(hub)
