"""Deduplication on idempotency_key across deliveries, sessions and time.

Invariant 6: every recovery path asserts *executed exactly once*.
"""

from __future__ import annotations

import trio
from deskbridge_common import Timings
from deskbridge_sidecar import tool
from deskbridge_sidecar._ledger import PRUNE_INTERVAL_S

from .conftest import settle


def counting_tool(seconds: float = 0.0):
    calls: list[dict] = []

    @tool(side_effects=True)
    async def submit(form: str) -> dict:
        calls.append({"form": form, "at": trio.current_time()})
        await trio.sleep(seconds)
        return {"submitted": form, "n": len(calls)}

    return submit, calls


async def test_two_deliveries_of_one_key_execute_once(autojump_clock, start_daemon):
    submit, calls = counting_tool()
    daemon, s = await start_daemon(tools=[submit])
    first = await s.call("submit", {"form": "f1"}, id="d-1", key="k-1")
    second = await s.call("submit", {"form": "f1"}, id="d-2", key="k-1")
    assert (first.id, second.id) == ("d-1", "d-2")
    assert first.ok and first.result == second.result == {"submitted": "f1", "n": 1}
    assert len(calls) == 1
    stats = daemon.statistics()
    assert stats.executions == {"submit": 1} and stats.dedupe_hits == 1


async def test_same_id_different_keys_are_not_deduplicated(autojump_clock, start_daemon):
    submit, calls = counting_tool()
    daemon, s = await start_daemon(tools=[submit])
    await s.call("submit", {"form": "a"}, id="same", key="k-a")
    await s.send_job("submit", {"form": "b"}, id="same", key="k-b")
    await s.wait_for(lambda: len(s.results["same"]) == 2)
    assert [c["form"] for c in calls] == ["a", "b"]


async def test_redelivery_while_the_original_runs_awaits_it(autojump_clock, start_daemon):
    submit, calls = counting_tool(seconds=10)
    daemon, s = await start_daemon(tools=[submit])
    original = await s.send_job("submit", {"form": "f"}, key="k-run")
    await settle()
    await trio.sleep(4)
    redelivery = await s.send_job("submit", {"form": "f"}, key="k-run")
    second = await s.wait_result(redelivery.id)
    assert trio.current_time() == 10  # answered when the original finished, not 10 s later
    first = await s.wait_result(original.id)
    assert first.result == second.result and len(calls) == 1


async def test_failures_are_cached_too(autojump_clock, start_daemon):
    calls = []

    @tool
    def flaky():
        calls.append(1)
        raise RuntimeError("half-submitted")

    daemon, s = await start_daemon(tools=[flaky])
    first = await s.call("flaky", key="k-f")
    second = await s.call("flaky", key="k-f")
    assert first.error == second.error and first.error.code == "crashed"
    assert len(calls) == 1


async def test_dedupe_survives_a_dropped_socket(autojump_clock, start_daemon, hub):
    """Socket drops mid-job; the original finishes anyway (it runs in the daemon's
    nursery); the redelivery on the new session is answered from the cache."""
    submit, calls = counting_tool(seconds=30)
    daemon, s1 = await start_daemon(tools=[submit])
    original = await s1.send_job("submit", {"form": "f"}, id="d-old", key="k-drop")
    await settle()
    await trio.sleep(5)
    s1.abort()  # the network dies: no close frame
    s2 = await hub.next_session()
    assert trio.current_time() < 30 and daemon.statistics().running == "submit"
    await trio.sleep(30)  # the original finishes meanwhile, unobserved
    assert daemon.statistics().running is None and len(calls) == 1
    redelivered = await s2.call("submit", {"form": "f"}, id="d-new", key="k-drop")
    assert redelivered.id == "d-new"
    assert redelivered.ok and redelivered.result == {"submitted": "f", "n": 1}
    assert "d-old" not in s1.results  # that reply was lost with the socket
    assert len(calls) == 1 and daemon.statistics().executions == {"submit": 1}
    assert original.id == "d-old"


async def test_redelivery_on_a_new_session_awaits_the_orphaned_original(
    autojump_clock, start_daemon, hub
):
    submit, calls = counting_tool(seconds=30)
    daemon, s1 = await start_daemon(tools=[submit])
    await s1.send_job("submit", {"form": "f"}, key="k-orphan")
    await settle()
    await trio.sleep(5)
    await s1.close(1012, "hub restarting")
    s2 = await hub.next_session()
    assert trio.current_time() == 5  # 1012: reconnected at once
    redelivered = await s2.call("submit", {"form": "f"}, key="k-orphan")
    assert trio.current_time() == 30 and redelivered.result["n"] == 1
    assert len(calls) == 1


async def test_an_orphaned_run_still_blocks_the_next_tool(autojump_clock, start_daemon, hub):
    """One browser: a run left behind by a dropped socket and the new session's first
    job must not overlap."""
    spans: dict[str, list[float]] = {}

    @tool
    async def browse(name: str, seconds: float) -> str:
        spans[name] = [trio.current_time()]
        await trio.sleep(seconds)
        spans[name].append(trio.current_time())
        return name

    daemon, s1 = await start_daemon(tools=[browse])
    await s1.send_job("browse", {"name": "old", "seconds": 20})
    await settle()
    s1.abort()
    s2 = await hub.next_session()
    result = await s2.call("browse", {"name": "new", "seconds": 1})
    assert result.ok
    assert spans["new"][0] >= spans["old"][1] == 20


async def test_keys_are_kept_until_their_deadline_plus_the_result_ttl(
    autojump_clock, start_daemon, wall
):
    """The old cache forgot after 300 s whatever the deadline; the ledger keeps a key
    until the latest moment it could be redelivered: its deadline + the result TTL."""
    submit, calls = counting_tool()
    daemon, s = await start_daemon(tools=[submit])
    deadline = wall() + 3600
    await s.call("submit", {"form": "f"}, key="k-ttl", deadline=deadline)
    await trio.sleep(3600 + 300 - 120)  # past the memory cache, inside the window
    again = await s.call("submit", {"form": "f"}, key="k-ttl", deadline=wall() + 60)
    assert again.result["n"] == 1 and len(calls) == 1
    await trio.sleep(120 + PRUNE_INTERVAL_S)  # past deadline + TTL, and one prune pass
    assert (await s.call("submit", {"form": "f"}, key="k-ttl")).result["n"] == 2
    assert len(calls) == 2


async def test_the_ledger_remembers_what_the_memory_cache_evicted(autojump_clock, start_daemon):
    """Issue 12: 400 keyed jobs, the oldest pushed out of the 256-entry cache ran again
    on redelivery. The memory cache is only a fast path now."""
    submit, calls = counting_tool()
    daemon, s = await start_daemon(tools=[submit], timings=Timings(dedupe_size=2))
    for key in ("k1", "k2", "k3"):
        await s.call("submit", {"form": key}, key=key)
    assert daemon.statistics().dedupe_entries == 2
    assert (await s.call("submit", {"form": "k3"}, key="k3")).result["n"] == 3  # memory
    assert (await s.call("submit", {"form": "k1"}, key="k1")).result["n"] == 1  # ledger
    assert len(calls) == 3


async def test_same_key_other_args_or_tool_is_refused(autojump_clock, start_daemon):
    submit, calls = counting_tool()

    @tool
    def other(form: str) -> str:
        calls.append({"form": "other"})
        return form

    daemon, s = await start_daemon(tools=[submit, other])
    first = await s.call("submit", {"form": "a"}, key="k-one")
    changed = await s.call("submit", {"form": "b"}, key="k-one")
    elsewhere = await s.call("other", {"form": "a"}, key="k-one")
    same = await s.call("submit", {"form": "a"}, key="k-one")
    assert first.ok and same.result == first.result
    for refused in (changed, elsewhere):
        assert not refused.ok and refused.error.code == "idempotency_key_reused"
    assert "different arguments" in changed.error.message
    assert "another tool" in elsewhere.error.message
    assert len(calls) == 1


async def test_same_key_other_args_while_the_original_runs_is_refused(autojump_clock, start_daemon):
    submit, calls = counting_tool(seconds=10)
    daemon, s = await start_daemon(tools=[submit])
    original = await s.send_job("submit", {"form": "a"}, key="k-busy")
    await settle()
    changed = await s.send_job("submit", {"form": "b"}, key="k-busy")
    refused = await s.wait_result(changed.id)
    assert refused.error.code == "idempotency_key_reused" and trio.current_time() < 10
    assert (await s.wait_result(original.id)).ok and len(calls) == 1


async def test_status_is_never_cached(autojump_clock, start_daemon):
    daemon, s = await start_daemon()
    first = await s.call("status", key="k-status")
    await trio.sleep(5)
    second = await s.call("status", key="k-status")
    assert second.result["time"] - first.result["time"] == 5
    assert daemon.statistics().dedupe_entries == 0


async def test_one_delivery_is_checked_once_not_three_times(
    autojump_clock, start_daemon, monkeypatch
):
    """Issue 9: dedupe and preflight ran up to three times per delivery (reader, execute,
    run). Now the reader's admit() decides once; the run re-checks only the deadline."""
    from deskbridge_sidecar._runner import ToolRunner

    counts = {"reuse": 0, "refusal": 0, "expired": 0}
    for name, attr in (("reuse", "_check_reuse"), ("refusal", "_refusal"), ("expired", "_expired")):
        original = getattr(ToolRunner, attr)

        def counting(self, job, _original=original, _name=name):
            counts[_name] += 1
            return _original(self, job)

        monkeypatch.setattr(ToolRunner, attr, counting)
    submit, calls = counting_tool()
    daemon, s = await start_daemon(tools=[submit])
    result = await s.call("submit", {"form": "once"}, key="k-once")
    assert result.ok and len(calls) == 1
    # _refusal calls _expired itself: one full preflight, plus the deadline at start.
    assert counts == {"reuse": 1, "refusal": 1, "expired": 2}
