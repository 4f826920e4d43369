"""A graceful restart answers the callers still waiting in the draining process.

On SIGTERM a hub process drains: running jobs and waiting dispatch requests get the
grace (``DESKBRIDGE_GRACE_S``), then the process exits. An HTTP caller whose job runs
longer than the grace used to be *cut*: the connection closed with no response, counted
and logged nowhere. Now, at the grace's end, it is answered 503 ``unavailable`` naming
its ``job_id`` and stage (the job may still run: retry with the same idempotency key or
``GET /v1/jobs/{id}`` on any replica), before the process exits.

Two pods on one Redis: the sidecar holds its socket on pod B; the caller waits in pod A,
which is SIGTERMed (grace 1 s) while the 5 s job runs on B. The job still runs exactly
once, B reports it, and a retry with the same key through B attaches to it.
"""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from tests.chaos._harness import TIMINGS, headers, new_user, wait_online
from tests.procs import Ledger, Sidecar, issue, wait_until

pytestmark = pytest.mark.chaos

GRACE_S = 1.0
JOB_S = 5.0
#: ports of the two pods (free_port when set to 0)
PORT_A = int(os.environ.get("DESKBRIDGE_TEST_PORT_A", "0")) or None
PORT_B = int(os.environ.get("DESKBRIDGE_TEST_PORT_B", "0")) or None


def two_pods_desktop_on_b(tmp_path, procs):
    """Pods A and B (grace ``GRACE_S``, reclaim 60 s) and a counting sidecar connected to
    B. Returns ``(user, ledger, pod_a, pod_b)``; the caller is to wait in pod A."""
    user = new_user()
    ledger = Ledger(tmp_path / "ledger.jsonl")
    env = {**TIMINGS, "DESKBRIDGE_GRACE_S": str(GRACE_S), "DESKBRIDGE_RECLAIM_IDLE_S": "60"}
    pod_a = procs.hub(tmp_path, env, name="pod-a", port=PORT_A)
    pod_b = procs.hub(tmp_path, env, name="pod-b", port=PORT_B)
    procs.add(
        Sidecar(
            tmp_path, pod_b.ws, issue(user), tools=["counting_tools"], env={**env, **ledger.env()}
        )
    )
    wait_online(pod_b.http, user)
    return user, ledger, pod_a, pod_b


def test_sigterm_answers_a_waiting_http_caller_503_with_its_job(tmp_path, procs):
    user, ledger, pod_a, pod_b = two_pods_desktop_on_b(tmp_path, procs)
    key = "drain-" + user
    request = {"name": "record", "args": {"key": key, "seconds": JOB_S}, "timeout_s": 30}
    request["idempotency_key"] = key

    def post(base: str) -> httpx.Response:
        with httpx.Client(headers=headers(), timeout=40) as client:
            return client.post(f"{base}/v1/users/{user}/jobs", json=request)

    waiting = procs.callers.submit(post, pod_a.http)
    wait_until(lambda: ledger.starts(key), timeout_s=15, what="the job started")
    pod_a.signal_group(signal.SIGTERM)
    termed = time.monotonic()
    try:
        r = waiting.result(timeout=15)
    except httpx.HTTPError as exc:
        pytest.fail(f"the waiting caller was cut with no answer: {exc!r}")
    answered_s = time.monotonic() - termed
    assert r.status_code == 503, r.text
    body = r.json()
    assert body["status"] == "unavailable", body
    assert body["error"]["code"] == "unavailable", body
    assert "restart" in body["error"]["message"], body
    job_id = body["job_id"]
    assert body["detail"]["stage"] == "delivered", body  # running on the desktop
    assert GRACE_S - 0.2 < answered_s < GRACE_S + 4, answered_s  # at the grace's end
    assert pod_a.popen.wait(10) is not None  # and then pod A exits

    # the caller was counted and logged once, as unavailable (not abandoned)
    out = pod_a.output()
    assert out.count(f"call for job {job_id} answered: unavailable") == 1, out[-3000:]
    assert "abandoned" not in out, out[-3000:]

    # the job still runs once; any replica reports it; a retry with the key attaches
    wait_until(lambda: ledger.ends(key), timeout_s=15, what="the job finished")
    retry = post(pod_b.http)
    assert retry.status_code == 200, retry.text
    assert retry.json()["status"] == "completed" and retry.json()["job_id"] == job_id
    with httpx.Client(headers=headers(), timeout=10) as client:
        state = client.get(f"{pod_b.http}/v1/jobs/{job_id}")
    assert state.status_code == 200, state.text
    assert state.json()["terminal"] is True, state.json()
    assert state.json()["outcome"]["status"] == "completed", state.json()
    assert ledger.counts() == {key: 1}, ledger.events()


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_sigterm_answers_a_waiting_mcp_call_with_an_error_result_naming_its_job(
    tmp_path, procs, mode
):
    """The same over MCP: the tool call waiting in pod A gets an ``isError`` result,
    ``unavailable``, naming its job (was: the SDK client saw the stream end)."""
    import anyio

    from tests.integration.test_mcp import mcp_client

    user, ledger, pod_a, pod_b = two_pods_desktop_on_b(tmp_path, procs)
    key = f"drain-mcp-{mode}-" + user
    args = {"key": key, "seconds": JOB_S}

    async def call():
        with anyio.fail_after(30):
            async with mcp_client(pod_a, user, mode=mode) as client:
                async with anyio.create_task_group() as tg:

                    async def sigterm_once_started() -> None:
                        while not ledger.starts(key):  # noqa: ASYNC110 - another process's file
                            await anyio.sleep(0.05)
                        pod_a.signal_group(signal.SIGTERM)

                    tg.start_soon(sigterm_once_started)
                    return await client.call_tool(
                        "record", args, meta={"deskbridge/idempotency_key": key}
                    )

    result = anyio.run(call, backend="asyncio")
    assert result.is_error, result
    body = result.structured_content
    assert body["status"] == "unavailable" and body["detail"] == {"stage": "delivered"}, body
    job_id = body["job_id"]
    assert "restart" in body["error"]["message"], body
    assert pod_a.popen.wait(10) is not None
    assert pod_a.output().count(f"call for job {job_id} answered: unavailable") == 1
    wait_until(lambda: ledger.ends(key), timeout_s=15, what="the job finished")
    request = {"name": "record", "args": args, "idempotency_key": key, "timeout_s": 30}
    with httpx.Client(headers=headers(), timeout=40) as client:
        retry = client.post(f"{pod_b.http}/v1/users/{user}/jobs", json=request)
    assert retry.status_code == 200 and retry.json()["job_id"] == job_id, retry.text
    assert ledger.counts() == {key: 1}, ledger.events()
