"""A full queue refuses new work; it never drops accepted work to make room.

A user with ``jobs_maxlen`` entries not yet acknowledged (queued, or in flight) gets the
next call refused: ``QueueFull`` from Python, 429 ``queue_full`` with ``Retry-After`` over
HTTP, a JSON-RPC error with ``data.code`` ``queue_full`` over MCP; nothing of it is left
behind, and a retry with the same key once room frees runs the job. Was: the submit's
``XADD MAXLEN ~`` trimmed the oldest queued jobs, whose callers were then told ``lost``.
MemorySubstrate, memory sockets, MockClock (autojump)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing
from deskbridge_common import Job, JobResult, Timings
from deskbridge_hub import Bridge, QueueFull
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._session import HubState
from deskbridge_hub._substrate import idem_key

from tests.hub.test_outcomes import connect, sidecar
from tests.hub.test_session import wall


@pytest.fixture
def state() -> HubState:
    return HubState(
        substrate=MemorySubstrate(clock=wall),
        timings=Timings(jobs_maxlen=3),
        consumer="hub-1",
        wall_clock=wall,
    )


@pytest.fixture
def bridge(state: HubState) -> Bridge:
    return Bridge(state.substrate, state.timings, wall_clock=wall)


def _caller(
    bridge: Bridge, outcomes: dict[str, str], **options: float
) -> Callable[[str], Awaitable[None]]:
    """A call of ``echo`` for ``u1`` (room for three) under the key and job id ``key``
    that records its answer in ``outcomes[key]`` (a ``QueueFull`` checked first)."""

    async def caller(key: str) -> None:
        try:
            outcome = await bridge.dispatch(
                "u1", "echo", {}, idempotency_key=key, job_id=key, **options
            )
        except QueueFull as exc:
            assert (exc.limit, exc.user_id) == (3, "u1")
            assert exc.retry_after_s > 0
            assert "DESKBRIDGE_JOBS_MAXLEN" in str(exc) and "3" in str(exc)
            outcomes[key] = exc.status
        else:
            outcomes[key] = outcome.status

    return caller


async def test_a_flood_is_refused_and_every_accepted_job_runs(autojump_clock, state, bridge):
    """Five calls to a desktop that looks online and reads nothing, with room for three:
    the first three wait and complete once a desktop reads them; the last two are
    refused at once (they were ``lost`` before: the two oldest, trimmed). A retry of a
    refused call with its key, once there is room, runs the job."""
    await state.substrate.set_presence("u1", "ghost", 3600)  # looks online, nobody reads
    outcomes: dict[str, str] = {}
    caller = _caller(bridge, outcomes)

    async with trio.open_nursery() as nursery:
        for i in range(5):
            nursery.start_soon(caller, f"k{i}")
            await trio.sleep(0.01)
        await trio.testing.wait_all_tasks_blocked()
        assert outcomes == {"k3": "queue_full", "k4": "queue_full"}
        sub = state.substrate
        for refused in ("k3", "k4"):  # nothing left behind: no state, no key, no id claim
            assert await sub.get_job_state("u1", refused) is None
            assert await sub.job_owner(refused) is None
        kept = sub.keys_of("u1")
        assert idem_key("u1", "k3") not in kept and idem_key("u1", "k4") not in kept
        assert idem_key("u1", "k0") in kept  # (the accepted ones are indexed)
        assert (await sub.queue_info("u1")).length == 3
        ran: list[str] = []
        peer = await connect(nursery, state)

        async def answer(frame):
            if isinstance(frame, Job):
                ran.append(frame.idempotency_key)
                await peer.send(JobResult(frame.id, True, {}))

        nursery.start_soon(sidecar, peer, answer)
        with trio.fail_after(10):
            while len(ran) < 3:  # noqa: ASYNC110 - mock clock
                await trio.sleep(0.1)
        await caller("k3")  # the same key and job id: room now, it runs
        assert outcomes == {f"k{i}": "completed" for i in range(4)} | {"k4": "queue_full"}
        assert sorted(ran) == ["k0", "k1", "k2", "k3"]
        nursery.cancel_scope.cancel()


async def test_a_cancel_at_a_full_queue_trims_no_accepted_job(autojump_clock, state, bridge):
    """A cancel is never refused for want of room (it makes room), and its control entry
    must not trim an accepted job either: the memory substrate trims to exactly
    ``maxlen``, so a cancel at the bound took the oldest queued job's body."""
    await state.substrate.set_presence("u1", "ghost", 3600)
    async with trio.open_nursery() as nursery:
        for i in range(3):
            nursery.start_soon(
                lambda i=i: bridge.dispatch("u1", "echo", {}, job_id=f"j{i}", timeout_s=60)
            )
        await trio.testing.wait_all_tasks_blocked()
        assert await bridge.cancel("j2") == "queued"
        assert await state.substrate.trimmed("u1") == []
        nursery.cancel_scope.cancel()


async def test_repeated_cancels_of_a_running_job_enqueue_one_control_entry(
    autojump_clock, state, bridge
):
    """Each cancel of a running job added an indexed ``control: cancel`` entry; with more
    unread entries than ``CANCEL_TRIM_FACTOR`` x the bound, the cancel's own trim took
    accepted jobs nobody had read (their callers told ``lost``). A cancel of a job whose
    cancel is already requested (its flag set) adds none, and still answers its stage."""
    from deskbridge_hub._bridge_jobs import USER_SEPARATOR
    from deskbridge_hub._jobstate import JobState, Stage

    sub = state.substrate
    await sub.set_presence("u1", "ghost", 3600)
    job_id = f"j-run{USER_SEPARATOR}u1"
    await sub.claim_job("u1", job_id, JobState(Stage.DELIVERED, "u1"), ttl_s=600)
    for _ in range(3 * state.timings.jobs_maxlen):
        assert await bridge.cancel(job_id) == "delivered"
    controls = [f for f in sub._streams["u1"].entries.values() if f.get("control") == "cancel"]
    assert controls == [{"control": "cancel", "job_id": job_id}]
    assert len(sub._index["u1"]) == 1


async def test_entries_deleted_from_the_middle_are_answered_lost_and_free_the_queue(
    autojump_clock, state, bridge
):
    """An operator's XDEL of queued entries behind the stream's first entry: the lost
    entry sweep answers their callers ``lost`` and drops their index records, so they
    stop counting against the bound and new calls are accepted again. Was: the sweep
    looked only below the stream's first entry; the records stayed for ever (the callers
    waited for their timeout) and, with the bound's worth of them, every call was refused
    ``queue_full`` for good."""
    from deskbridge_hub._delivery import EntryServer
    from deskbridge_hub._memory_streams import _format_id

    sub = state.substrate  # room for three
    await sub.set_presence("u1", "ghost", 3600)  # looks online, nobody reads
    outcomes: dict[str, str] = {}
    caller = _caller(bridge, outcomes, timeout_s=600)

    async with trio.open_nursery() as nursery:
        for i in range(3):
            nursery.start_soon(caller, f"k{i}")
            await trio.testing.wait_all_tasks_blocked()
        first, *rest = sorted(sub._index["u1"])
        for leaked in rest:  # k1 and k2: the first entry stays
            sub.delete_entry("u1", _format_id(leaked))
        await caller("k3")
        assert outcomes == {"k3": "queue_full"}  # the leaked records fill the bound
        await EntryServer(sub, state.timings, "u1", "ghost", wall).answer_deleted([])
        await trio.testing.wait_all_tasks_blocked()
        assert outcomes == {"k3": "queue_full", "k1": "lost", "k2": "lost"}
        assert list(sub._index["u1"]) == [first]
        for key in ("k3", "k4"):  # room again: accepted, they wait in the queue
            nursery.start_soon(caller, key)
            await trio.testing.wait_all_tasks_blocked()
        assert len(sub._index["u1"]) == 3 and "k4" not in outcomes
        assert outcomes["k3"] == "queue_full"  # (its first answer; the retry waits)
        nursery.cancel_scope.cancel()


# -- over HTTP and MCP, counted ----------------------------------------------------------


@pytest.mark.parametrize("asgi_route", [True, False], ids=["asgi-route", "quart-route"])
async def test_over_http_a_full_queue_is_429_queue_full_with_retry_after(
    autojump_clock, monkeypatch, caplog, asgi_route
):
    """The first call waits in the queue (room for one); the second is answered at once:
    429, ``queue_full``, ``Retry-After``, the message naming the limit and its variable,
    the caller's ``job_id`` echoed (it names no job), counted and logged as that answer.
    A retry with the same key and id once the first is answered is queued."""
    import logging

    from tests.hub.test_calls_counted import _call_lines, _count
    from tests.hub.test_jobs_asgi import JSON, ONLINE, PATH, hub

    caplog.set_level(logging.INFO, logger="deskbridge.hub.calls")
    async with hub(monkeypatch, asgi_route=asgi_route, timings=Timings(jobs_maxlen=1)) as h:
        await h.substrate.inner.set_presence(ONLINE, "sess-1", 3600.0)
        first: list[int] = []

        async def wait_in_queue() -> None:
            r = await h.client.post(PATH, data=b'{"name": "echo", "timeout_s": 5}', headers=JSON)
            first.append(r.status_code)

        before = _count("queue_full")
        body = b'{"name": "echo", "job_id": "mine-2", "idempotency_key": "key-2"}'
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_in_queue)
            await trio.testing.wait_all_tasks_blocked()
            started = trio.current_time()
            r = await h.client.post(PATH, data=body, headers=JSON)
            assert trio.current_time() == started  # at once, not after a wait
        assert first == [504]  # nobody read it: timeout, its entry still queued
        assert r.status_code == 429, await r.get_data()
        assert r.headers["Retry-After"] == "5"
        answer = await r.get_json()
        assert answer["job_id"] == "mine-2"
        error = answer["error"]
        assert error["code"] == "queue_full" and error["limit"] == 1
        assert "DESKBRIDGE_JOBS_MAXLEN" in error["message"] and " 1 " in error["message"]
        assert _count("queue_full") - before == 1.0
        assert f"call for job mine-2 answered: queue_full (echo for {ONLINE})" in _call_lines(
            caplog
        )
        assert await h.substrate.inner.job_owner("mine-2") is None
        # the waiting job is answered (the desktop took it): room again for the same request
        (entry,) = await h.substrate.inner.read_new(ONLINE, "c1", count=1, block_ms=None)
        await h.substrate.inner.ack(ONLINE, entry.entry_id)
        retry = b'{"name": "echo", "job_id": "mine-2", "idempotency_key": "key-2", "timeout_s": 1}'
        r = await h.client.post(PATH, data=retry, headers=JSON)
        assert r.status_code == 504 and (await r.get_json())["detail"]["stage"] == "queued"


async def mcp_call_error(bridge: Bridge):
    """The JSON-RPC error of an MCP ``tools/call`` of ``echo`` for ``u1`` through
    ``bridge`` (``-32603``: asserted), which must refuse it."""
    import types as pytypes

    import mcp_types as types
    from deskbridge_hub._mcp import UserEndpoint
    from mcp.shared.exceptions import MCPError

    endpoint = UserEndpoint("u1", bridge)
    ctx = pytypes.SimpleNamespace(params={"_meta": {}}, session=None)
    with pytest.raises(MCPError) as raised:
        await endpoint._call_tool(ctx, types.CallToolRequestParams(name="echo", arguments={}))
    assert raised.value.error.code == types.INTERNAL_ERROR
    return raised.value.error


async def test_over_mcp_a_full_queue_is_a_json_rpc_error_with_its_code():
    """As the hub's other refusals on MCP: a JSON-RPC error (``-32603``, as the 429s of
    the MCP mount) whose ``data`` holds what HTTP's error body holds."""
    from deskbridge_hub._bridge_jobs import queue_full

    async def dispatch(*args, **kwargs):
        raise queue_full("u1", 7, None)

    bridge = Bridge(MemorySubstrate())
    bridge.dispatch = dispatch  # type: ignore[method-assign]
    error = await mcp_call_error(bridge)
    assert error.message.startswith("queue_full: ") and "DESKBRIDGE_JOBS_MAXLEN" in error.message
    assert error.data == {"code": "queue_full", "limit": 7, "retry_after_s": 5}
