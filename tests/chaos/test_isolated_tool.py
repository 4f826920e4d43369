"""Issue 12 item 7 on real processes: a tool holding the GIL in one long C call
(``sum(range(n))``) runs in its own process, so the sidecar's reader, pinger and
``status`` never stop: presence never flaps (ping every 1 s, deadline 2 s here) and
``status`` keeps answering while it runs. The field case, in a thread: no pong for 20 s,
close 4002, presence offline for half a minute. Figures: ``bench/gil_tool.py``."""

from __future__ import annotations

import statistics
import time

import httpx
import pytest

from tests.chaos._harness import TIMINGS, headers, new_user, wait_online
from tests.procs import REDIS_URL, RedisPoller, Sidecar, issue, wait_until

pytestmark = pytest.mark.chaos

N = 300_000_000  # about 3 s of one GIL-held C call on an idle core, more under load


def test_a_gil_holding_tool_in_its_own_process_keeps_presence_and_status(tmp_path, procs):
    user = new_user()
    hub = procs.hub(tmp_path, TIMINGS, name="pod")
    sidecar = procs.add(Sidecar(tmp_path, hub.ws, issue(user), tools=["gil_tools"],
                                env=TIMINGS))  # fmt: skip
    session = wait_online(hub.http, user)
    job = procs.callers.post(hub.http, user, "crunch", {"n": N}, key="gil-" + user, timeout_s=120)
    latencies: list[float] = []
    flaps: list[str | None] = []
    with RedisPoller(REDIS_URL) as poller, httpx.Client(headers=headers(), timeout=10) as client:
        url = f"{hub.http}/v1/users/{user}/status"
        wait_until(lambda: client.post(url).json()["result"]["running"] == "crunch",
                   timeout_s=30, interval_s=0.05, what="crunch running")  # fmt: skip
        while not job.done():
            holder = poller.presence(user)
            if holder != session:
                flaps.append(holder)
            t0 = time.perf_counter()
            r = client.post(url)
            latencies.append(time.perf_counter() - t0)
            assert r.status_code == 200, r.text
            time.sleep(0.05)
    answer = job.result(timeout=5)
    assert answer.status == "completed", answer.body
    assert answer.body["result"]["sum"] == sum(range(N))
    assert answer.body["result"]["pid"] != sidecar.pid  # it ran in another process
    assert flaps == []  # presence named the same session throughout
    assert sidecar.output().count("welcomed by hub") == 1  # the socket never dropped
    assert len(latencies) >= 5 and max(latencies) < 1.0, latencies
    print(f"\nstatus during a GIL-held tool in its own process: {len(latencies)} calls, "
          f"p50 {statistics.median(latencies) * 1000:.1f} ms, "
          f"max {max(latencies) * 1000:.1f} ms; presence flaps: 0")  # fmt: skip
