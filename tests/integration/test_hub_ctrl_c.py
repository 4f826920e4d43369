"""Ctrl-C on ``deskbridge-hub serve --workers 1`` (a developer's terminal) drains like
SIGTERM: one line saying so, sockets closed with 1012 (the sidecar reconnects at once
instead of backing off), exit 0. It used to stop silently, sockets just gone."""

from __future__ import annotations

import contextlib
import secrets
import signal
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.procs import Hub, Sidecar, api, issue, running, wait_log, wait_until

pytestmark = pytest.mark.integration


def test_ctrl_c_drains_like_sigterm(tmp_path) -> None:
    user = "ctrlc-" + secrets.token_hex(4)
    hub = Hub(tmp_path, workers=1, env={"DESKBRIDGE_GRACE_S": "5"})
    with running(hub):
        hub.wait_healthy()
        sidecar = Sidecar(tmp_path, hub.ws, issue(user))
        with running(sidecar):
            wait_log(sidecar, r"welcomed by hub", timeout_s=20)
            hub.popen.send_signal(signal.SIGINT)
            assert hub.popen.wait(timeout=30) == 0
            out = hub.output()
            assert "SIGINT: draining (grace 5.0 s); Ctrl-C again to stop at once" in out
            assert "drained 1 sessions" in out
            wait_log(sidecar, r"closed, code 1012: hub restarting", timeout_s=10)


@contextlib.contextmanager
def _call_in_flight(tmp_path, seconds: float) -> Iterator[tuple[Hub, Sidecar, Future[Any]]]:
    """A ``--workers 2`` hub, a sidecar, and a ``sleep`` call in flight over a connection
    pinned to the worker holding the sidecar's socket (so the other worker is idle)."""
    user = "ctrlc2-" + secrets.token_hex(4)
    job_id = "ctrlc2-job-" + secrets.token_hex(4)
    hub = Hub(tmp_path, workers=2, env={"DESKBRIDGE_GRACE_S": "20"})
    with running(hub), ThreadPoolExecutor(1) as pool, contextlib.ExitStack() as clients:
        hub.wait_healthy()
        sidecar = Sidecar(tmp_path, hub.ws, issue(user))
        with running(sidecar):
            wait_log(sidecar, r"welcomed by hub", timeout_s=20)
            admin = clients.enter_context(api())
            holder = wait_until(
                lambda: admin.get(f"{hub.http}/v1/admin/users/{user}").json()["hub_consumer"],
                timeout_s=10,
                what="the holder's consumer name",
            )
            pinned = None
            for _ in range(50):  # a new keep-alive connection lands on either worker
                client = clients.enter_context(api())
                if client.get(f"{hub.http}/healthz").json()["consumer"] == holder:
                    pinned = client
                    break
            assert pinned is not None, "no connection reached the holder's worker"
            call = pool.submit(
                pinned.post,
                f"{hub.http}/v1/users/{user}/jobs",
                json={"name": "sleep", "args": {"seconds": seconds}, "job_id": job_id},
            )
            wait_until(
                lambda: (
                    admin.get(f"{hub.http}/v1/admin/users/{user}").json()["in_flight"] == [job_id]
                ),
                timeout_s=15,
                what="job in flight",
            )
            yield hub, sidecar, call


def test_ctrl_c_to_the_group_of_two_workers_drains_each_once(tmp_path) -> None:
    """Ctrl-C reaches the whole process group: the supervisor and both workers. Each
    worker drains once (the terminal's signal and the supervisor's request to drain are
    one operator action, not two), the supervisor waits for every worker, the call in
    flight gets its real result and the sidecar sees 1012.

    The other worker is idle and drains at once: before the fix Hypercorn's supervisor
    then sent its own SIGTERM to the busy worker, which counted it as a second Ctrl-C
    (the caller's connection dropped with no response, the socket closed 1006)."""
    with _call_in_flight(tmp_path, 4) as (hub, sidecar, call):
        hub.signal_group(signal.SIGINT)
        response = call.result(timeout=30)
        assert response.status_code == 200, response.text
        assert response.json()["status"] == "completed"
        assert hub.popen.wait(timeout=30) == 0
        out = hub.output()
        assert "stopping without waiting" not in out, out[-3000:]
        assert out.count(": draining (grace 20.0 s)") == 2, out[-3000:]
        assert out.count("drained ") == 2, out[-3000:]
        wait_log(sidecar, r"closed, code 1012: hub restarting", timeout_s=10)


def test_sigterm_to_the_supervisor_alone_drains_every_worker(tmp_path) -> None:
    # The workers get no signal of their own: the supervisor asks each to drain.
    with _call_in_flight(tmp_path, 4) as (hub, sidecar, call):
        hub.popen.send_signal(signal.SIGTERM)
        response = call.result(timeout=30)
        assert response.status_code == 200, response.text
        assert hub.popen.wait(timeout=30) == 0
        out = hub.output()
        assert "stopping without waiting" not in out, out[-3000:]
        assert out.count("the supervisor asks (SIGTERM): draining (grace 20.0 s)") == 2
        wait_log(sidecar, r"closed, code 1012: hub restarting", timeout_s=10)


def test_a_second_ctrl_c_stops_at_once(tmp_path) -> None:
    # The operator's second Ctrl-C does not wait for the 30 s job (nor the 20 s grace).
    with _call_in_flight(tmp_path, 30) as (hub, _sidecar, call):
        hub.signal_group(signal.SIGINT)
        wait_log(hub, r"SIGINT: draining 2 workers", timeout_s=10)
        wait_until(
            lambda: hub.output().count(": draining (grace 20.0 s)") == 2,
            timeout_s=10,
            what="both workers draining",
        )
        hub.signal_group(signal.SIGINT)
        assert hub.popen.wait(timeout=10) == 0
        assert "SIGINT again: stopping without waiting for running jobs" in hub.output()
        with contextlib.suppress(httpx.HTTPError):
            assert call.result(timeout=10).status_code != 200


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_to_the_group_while_the_workers_start_drains_and_exits_0(tmp_path, signum):
    """systemd stops the whole group; a worker still importing died of SIGTERM's default
    action (the supervisor then exited 1, a crash). Found by a review of the supervisor."""
    import os
    from pathlib import Path

    hub = Hub(tmp_path, workers=2, env={"DESKBRIDGE_GRACE_S": "3"})

    def workers() -> list[int]:
        try:
            kids = Path(f"/proc/{hub.pid}/task/{hub.pid}/children").read_text().split()
        except FileNotFoundError:
            return []
        spawned = []
        for kid in kids:  # not multiprocessing's resource tracker
            with contextlib.suppress(FileNotFoundError):
                if b"spawn_main" in Path(f"/proc/{kid}/cmdline").read_bytes():
                    spawned.append(int(kid))
        return spawned

    try:
        wait_until(lambda: len(workers()) >= 2, timeout_s=30, what="both workers spawned")
        os.killpg(hub.pid, signum)  # while they import
        code = hub.popen.wait(timeout=60)
        out = hub.output()
    finally:
        hub.stop(timeout_s=5)
    assert "exited with signal" not in out, out[-3000:]
    assert code == 0, out[-3000:]
