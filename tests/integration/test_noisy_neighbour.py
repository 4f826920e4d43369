"""One API-key holder flooding what a hub process shares, against a real
``deskbridge-hub serve --workers 1`` on Redis: the flood meets a bound that names itself,
and another user's requests are still served.
"""

from __future__ import annotations

import secrets
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import trio

from tests.mcp_wire import initialize_2025
from tests.procs import API_KEY, REDIS_URL, Hub, running

pytestmark = pytest.mark.integration


@pytest.fixture
def hub(tmp_path) -> Iterator[Hub]:
    hub = Hub(tmp_path, workers=1)
    with running(hub):
        hub.wait_healthy()
        yield hub


def _queued_job(user: str) -> str:
    """A job of ``user`` recorded as queued (nobody will run it), straight in Redis."""
    from deskbridge_hub import RedisSubstrate
    from deskbridge_hub._jobstate import JobState, Stage

    job = f"{secrets.token_hex(8)}~{user}"

    async def main() -> None:
        substrate = RedisSubstrate.from_url(REDIS_URL)
        async with substrate:
            with trio.fail_after(10):
                await substrate.set_job_state(user, job, JobState(Stage.QUEUED, user), ttl_s=120)

    trio.run(main)
    return job


def _open_events(hub: Hub, job: str) -> tuple[socket.socket, str]:
    """``GET /v1/jobs/{job}/events`` on a raw socket: the socket (left open) and the
    response head (with the body of a response that has a ``content-length``)."""
    sock = socket.create_connection(("127.0.0.1", hub.port), timeout=10)
    sock.sendall(
        f"GET /v1/jobs/{job}/events HTTP/1.1\r\nHost: hub\r\n"
        f"Authorization: Bearer {API_KEY}\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head and len(head) < 65536:
        chunk = sock.recv(65536)
        if not chunk:
            break
        head += chunk
    text = head.decode(errors="replace")
    lines = text.lower().splitlines()
    length = next((int(x.split(":")[1]) for x in lines if x.startswith("content-length:")), 0)
    while len(head.split(b"\r\n\r\n", 1)[-1]) < length:  # a refusal's body, whole
        chunk = sock.recv(65536)
        if not chunk:
            break
        head += chunk
    return sock, head.decode(errors="replace")


def test_one_user_cannot_hold_every_progress_stream_of_a_process(hub):
    """Before: every open event stream holds a Redis read that polls once the dedicated
    blocking connections are taken; 1,000 streams on one job took another user's call
    latency from p95 21 ms to 1.9 s (worst 21 s). Now one user's streams in a process are
    bounded (``MAX_EVENT_STREAMS_PER_USER``): the next is 429 naming the bound, another
    user's stream opens, and a closed stream frees its place."""
    from deskbridge_hub._events import MAX_EVENT_STREAMS_PER_USER

    noisy, other = "noisy-" + secrets.token_hex(3), "other-" + secrets.token_hex(3)
    jobs = [_queued_job(noisy) for _ in range(2)]
    held = []
    try:
        for i in range(MAX_EVENT_STREAMS_PER_USER):
            sock, head = _open_events(hub, jobs[i % 2])
            held.append(sock)
            assert head.startswith("HTTP/1.1 200"), (i, head)
        sock, head = _open_events(hub, jobs[0])
        with sock:
            assert head.startswith("HTTP/1.1 429"), head
            assert "retry-after" in head.lower(), head
            assert "too_many_requests" in head and str(MAX_EVENT_STREAMS_PER_USER) in head, head
        sock, head = _open_events(hub, _queued_job(other))
        with sock:
            assert head.startswith("HTTP/1.1 200"), head
        held.pop().close()
        for _ in range(50):  # the hub sees the close within its next read of Redis (1 s)
            sock, head = _open_events(hub, jobs[0])
            if head.startswith("HTTP/1.1 200"):
                held.append(sock)
                break
            sock.close()
            trio.run(trio.sleep, 0.1)
        else:
            raise AssertionError(f"a closed stream's place was not freed: {head}")
    finally:
        for s in held:
            s.close()


_INITIALIZE = initialize_2025("flood")


async def _initialize(client, hub: Hub, user: str):
    import httpx

    return await client.post(
        f"{hub.http}/v1/users/{user}/mcp",
        json=_INITIALIZE,
        headers={
            "Authorization": f"Bearer {API_KEY}",
            "Accept": "application/json, text/event-stream",
        },
        timeout=httpx.Timeout(20.0),
    )


def test_one_user_cannot_open_mcp_sessions_without_bound(hub):
    """Before: 2025-era MCP sessions (``initialize``, ``Mcp-Session-Id``) were bounded
    only by the SDK's 10,000 per user endpoint and lived 30 minutes idle; each held about
    40 KB, so one API-key holder opening 4,000 took the process from 180 to 340 MB, for
    every user's calls. Now a user has at most ``MAX_SESSIONS_PER_USER`` in a process:
    the next ``initialize`` is 429 naming the bound; another user still opens one."""
    import httpx
    from deskbridge_hub._mcp_mount import MAX_SESSIONS_PER_USER

    noisy, other = "noisy-" + secrets.token_hex(3), "other-" + secrets.token_hex(3)

    async def main() -> None:
        async with httpx.AsyncClient() as client:
            with trio.fail_after(25):
                for i in range(MAX_SESSIONS_PER_USER):
                    r = await _initialize(client, hub, noisy)
                    assert r.status_code == 200, (i, r.text)
                r = await _initialize(client, hub, noisy)
                assert r.status_code == 429, r.text
                assert "too_many_requests" in r.text and str(MAX_SESSIONS_PER_USER) in r.text
                r = await _initialize(client, hub, other)
                assert r.status_code == 200, r.text

    trio.run(main)


def test_concurrent_first_mcp_requests_for_a_new_user_are_all_served(hub):
    """Before: the first request for a user starts that user's MCP endpoint; requests
    arriving meanwhile found it registered but not yet running and got 500 ("Task group
    is not initialized") with a traceback in the log (seen with 2,000 new user ids)."""
    import httpx

    async def main() -> None:
        statuses: list[int] = []
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=20)) as client:
            for _ in range(5):
                user = "new-" + secrets.token_hex(4)

                async def one(user: str = user) -> None:
                    statuses.append((await _initialize(client, hub, user)).status_code)

                with trio.fail_after(20):
                    async with trio.open_nursery() as nursery:
                        for _ in range(10):
                            nursery.start_soon(one)
        assert set(statuses) == {200}, statuses

    trio.run(main)


def test_a_user_reconnecting_in_a_loop_is_told_to_wait_and_others_still_connect(hub, tmp_path):
    """Found by fault injection (``bench/handshake_storm.py``): one client with a valid
    token doing the whole handshake 300 times a second took another user's echo p50 from
    4.7 to 81 ms on one worker; nothing bounded it. Now past a burst the process refuses
    that user's upgrades with 429 ``too_many_requests`` and ``Retry-After`` (before any
    Redis work), a real sidecar of the user prints why and comes back after it, and
    another user's sidecar connects meanwhile."""
    from deskbridge_hub._handshake_pace import BURST

    from tests.procs import Sidecar, api, issue, raw_upgrade, wait_log, wait_until

    looping, other = "looping-" + secrets.token_hex(3), "other-" + secrets.token_hex(3)
    token = issue(looping)
    answers = [raw_upgrade(hub, token) for _ in range(BURST + 20)]
    statuses = [status for status, _body in answers]
    assert statuses[:BURST] == [101] * BURST, statuses
    assert statuses[BURST:].count(429) >= 15, statuses  # a refill may admit one a second
    assert "too_many_requests" in answers[-1][1]
    stop = threading.Event()

    def keep_looping() -> None:  # the loop goes on while the real sidecar starts
        deadline = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < deadline:
            raw_upgrade(hub, token)
            time.sleep(0.05)

    looper = threading.Thread(target=keep_looping, daemon=True)
    looper.start()
    bystander = Sidecar(tmp_path, hub.ws, issue(other), name="bystander")
    desktop = Sidecar(tmp_path, hub.ws, token, name="looping")
    try:
        with running(bystander, desktop), api() as client:
            wait_until(
                lambda: client.get(f"{hub.http}/v1/users/{other}/presence").json()["online"],
                timeout_s=30,
                what="the other user's sidecar online",
            )
            wait_log(desktop, r"HTTP 429 \(too_many_requests", timeout_s=30)
            stop.set()
            looper.join(10)
            wait_until(
                lambda: client.get(f"{hub.http}/v1/users/{looping}/presence").json()["online"],
                timeout_s=30,
                what="the looping user's sidecar online after Retry-After",
            )
            r = client.post(f"{hub.http}/v1/users/{looping}/jobs", json={"name": "echo"})
            assert r.status_code == 200, r.text
    finally:
        stop.set()
        looper.join(10)
