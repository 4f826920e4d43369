"""Issue 2, item 9: real Redis, `deskbridge-hub serve --workers 2`, a real sidecar process."""

from __future__ import annotations

import secrets
import statistics
import time

import httpx
import pytest

from tests.procs import Hub, Sidecar, api, issue, running, wait_until

pytestmark = pytest.mark.integration


def test_any_worker_answers_presence_and_echo_then_offline_after_stop(tmp_path):
    user = "it-" + secrets.token_hex(4)
    hub = Hub(tmp_path, workers=2)
    sidecar = None
    with running(hub):
        hub.wait_healthy()
        sidecar = Sidecar(tmp_path, hub.ws, issue(user))
        with running(sidecar), api() as client:
            url = f"{hub.http}/v1/users/{user}"
            wait_until(
                lambda: client.get(url + "/presence").json()["online"],
                timeout_s=15,
                what="presence online",
            )
            # 200 presence reads, each on a fresh connection so both workers answer
            online = []
            consumers = set()
            for _ in range(200):
                with api() as c:
                    online.append(c.get(url + "/presence").json()["online"])
            assert online == [True] * 200
            # the kernel hands each new connection to one of the two accepting workers,
            # often the same one many times in a row: ask until both answered (bounded)
            for _ in range(300):
                with httpx.Client() as c:
                    consumers.add(c.get(hub.http + "/healthz").json()["consumer"])
                if len(consumers) == 2:
                    break
            assert len(consumers) == 2, f"expected both workers to answer, saw {consumers}"

            rtts = []
            for i in range(100):
                args = {"i": i, "nonce": secrets.token_hex(4)}
                with api() as c:
                    t0 = time.perf_counter()
                    r = c.post(url + "/jobs", json={"name": "echo", "args": args})
                    rtts.append(time.perf_counter() - t0)
                assert r.status_code == 200, r.text
                body = r.json()
                assert body["status"] == "completed" and body["result"] == args
            median_ms = statistics.median(rtts) * 1000
            print(
                f"\necho round trip through 2 workers: median {median_ms:.2f} ms, "
                f"p90 {sorted(rtts)[89] * 1000:.2f} ms, max {max(rtts) * 1000:.2f} ms"
            )

            sidecar.stop()
            stopped = time.monotonic()
            wait_until(
                lambda: not client.get(url + "/presence").json()["online"],
                timeout_s=30 + 2,
                what="presence offline",
            )
            print(f"presence offline {time.monotonic() - stopped:.2f} s after the sidecar stopped")
            t0 = time.perf_counter()
            r = client.post(url + "/jobs", json={"name": "echo", "args": {}})
            took = time.perf_counter() - t0
            assert r.status_code == 503 and r.json()["status"] == "offline"
            assert took < 1.0
