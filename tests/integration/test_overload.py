"""Admission control in a real ``deskbridge-hub serve --workers 1`` on Redis with a real
sidecar: over ``DESKBRIDGE_MAX_CALLS`` a call is refused at once with 503
``overloaded`` and ``Retry-After``, and nothing of it reaches Redis (the user's stream and
entry index unchanged); the calls it took, and the calls after, still work.
"""

from __future__ import annotations

import secrets
import threading
import time

import httpx
import pytest
import trio

from tests.procs import API_KEY, Hub, Sidecar, issue, running, wait_until

pytestmark = pytest.mark.integration


def test_a_call_over_the_bound_is_503_with_retry_after_and_enqueues_nothing(
    tmp_path, raw_redis
):
    user = f"over-{secrets.token_hex(4)}"
    hub = Hub(tmp_path, workers=1, env={"DESKBRIDGE_MAX_CALLS": "1"})
    with running(hub):
        hub.wait_healthy()
        sidecar = Sidecar(tmp_path, hub.ws, issue(user))
        with running(sidecar), httpx.Client(
            base_url=hub.http, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30
        ) as client:
            jobs = f"/v1/users/{user}/jobs"
            wait_until(
                lambda: client.get(f"/v1/users/{user}/presence").json()["online"], timeout_s=30
            )
            taken: list[httpx.Response] = []
            slow = threading.Thread(
                target=lambda: taken.append(
                    client.post(jobs, json={"name": "sleep", "args": {"seconds": 3}})
                )
            )
            slow.start()
            try:

                def queue() -> tuple[int, int]:
                    async def read() -> tuple[int, int]:
                        with trio.fail_after(10):
                            xlen = await raw_redis("XLEN", f"bridge:jobs:{{{user}}}")
                            hlen = await raw_redis("HLEN", f"bridge:index:{{{user}}}")
                            return xlen, hlen

                    return trio.run(read)

                # the slow call holds the process's one slot (its job is on the stream)
                before = wait_until(lambda: (q := queue())[0] and q, timeout_s=10)
                started = time.monotonic()
                refused = client.post(
                    jobs, json={"name": "echo", "args": {"x": 1}, "idempotency_key": "k-over"}
                )
                took_s = time.monotonic() - started
                assert queue() == before  # nothing enqueued, nothing indexed
            finally:
                slow.join(30)
            assert refused.status_code == 503, refused.text
            assert refused.headers["Retry-After"] == "2"
            error = refused.json()["error"]
            assert (error["code"], error["reason"]) == ("overloaded", "calls")
            assert "DESKBRIDGE_MAX_CALLS=1" in error["message"]
            assert took_s < 2.0  # at once (a loaded machine's round trip, not a wait)
            assert [r.status_code for r in taken] == [200]
            assert taken[0].json()["status"] == "completed"
            again = client.post(
                jobs, json={"name": "echo", "args": {"x": 1}, "idempotency_key": "k-over"}
            )
            assert again.status_code == 200 and again.json()["result"] == {"x": 1}
            metrics = client.get("/metrics").text
            assert 'outcome="overloaded"' in metrics
