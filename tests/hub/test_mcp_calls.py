"""``tools/call`` through a user's MCP endpoint (``UserEndpoint._call_tool``) on the memory
substrate, memory sockets and MockClock: the same refusal answers as HTTP (code and
field), and an abandoned call cancels its own job only, never one another caller is
attached to."""

from __future__ import annotations

import types as pytypes
from typing import Any

import mcp_types as types
import pytest
import trio
import trio.testing
from deskbridge_common import Job, JobResult, Timings, ToolSpec
from deskbridge_hub import BadRequest, Bridge
from deskbridge_hub._http import bridge_error_answer
from deskbridge_hub._mcp import UserEndpoint
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._outcome import Outcome
from deskbridge_hub._progress import ProgressReport
from deskbridge_hub._session import HubState
from mcp.shared.exceptions import MCPError

from tests.hub.test_outcomes import bridge, connect, ignore, sidecar, state  # noqa: F401
from tests.hub.test_session import wall

SCHEMA = {
    "type": "object",
    "properties": {"selector": {"type": "string"}},
    "required": ["selector"],
    "additionalProperties": False,
}


def _ctx(meta: dict[str, Any] | None = None) -> Any:
    """The part of the SDK's request context ``_call_tool`` reads."""
    return pytypes.SimpleNamespace(params={"_meta": meta or {}}, session=None)


async def _mcp_call(
    via: Bridge, name: str, args: dict[str, Any], meta: dict[str, Any] | None = None
) -> types.CallToolResult:
    endpoint = UserEndpoint("u1", via)
    params = types.CallToolRequestParams(name=name, arguments=args)
    return await endpoint._call_tool(_ctx(meta), params)


async def _http_error(via: Bridge, name: str, args: dict[str, Any]) -> tuple[int, Any]:
    with pytest.raises(BadRequest) as refused:
        await via.dispatch("u1", name, args, timeout_s=10)
    status, body = bridge_error_answer(refused.value)
    return status, body["error"]


@pytest.mark.parametrize(
    "args",
    [{"selector": 5}, {"selector": "x", "extra": 1}, {"selector": "x" * (300 * 1024)}],
    ids=["schema type", "schema extra field", "over max_args_bytes"],
)
async def test_args_the_hub_refuses_get_http_s_code_and_field_through_mcp(
    autojump_clock,
    state,  # noqa: F811
    bridge,  # noqa: F811
    args,
):
    async with trio.open_nursery() as nursery:
        peer = await connect(nursery, state, [ToolSpec("click", "click", SCHEMA, True)])
        nursery.start_soon(sidecar, peer, ignore)
        status, http = await _http_error(bridge, "click", args)
        assert status == 400 and http["field"] == "args"
        got = await _mcp_call(bridge, "click", args)
        assert got.is_error
        error = got.structured_content["error"]
        assert (error["code"], error["field"]) == (http["code"], http["field"])
        assert got.structured_content["status"] == http["code"]  # not "failed": nothing ran
        assert got.structured_content["job_id"] is None
        assert state.substrate.pending_count("u1") == 0
        nursery.cancel_scope.cancel()


async def test_an_unknown_tool_is_invalid_params_with_http_s_code_and_field(
    autojump_clock,
    state,  # noqa: F811
    bridge,  # noqa: F811
):
    async with trio.open_nursery() as nursery:
        peer = await connect(nursery, state, [ToolSpec("click", "click", SCHEMA, True)])
        nursery.start_soon(sidecar, peer, ignore)
        _, http = await _http_error(bridge, "nope", {})
        with pytest.raises(MCPError) as refused:
            await _mcp_call(bridge, "nope", {})
        assert refused.value.error.code == types.INVALID_PARAMS
        assert refused.value.error.data == {"code": http["code"], "field": http["field"]}
        nursery.cancel_scope.cancel()


async def test_a_reused_idempotency_key_is_invalid_params_with_http_s_code_and_field(
    autojump_clock,
    state,  # noqa: F811
    bridge,  # noqa: F811
):
    """The key used for other arguments: HTTP's 422 names ``field: idempotency_key`` and
    the job the key started; MCP's ``-32602`` carries the same code, that job and the
    field as MCP spells it (``_meta.deskbridge/idempotency_key``, as for a malformed key).
    It had no ``field``: the one hub refusal over MCP that did not say which field."""
    from deskbridge_hub import IdempotencyKeyReused
    from deskbridge_hub._mcp import META_IDEMPOTENCY_KEY

    await state.substrate.set_presence("u1", "ghost", 3600)  # online; nobody reads jobs
    first = await bridge.dispatch("u1", "click", {"selector": "a"}, idempotency_key="k1",
                                  timeout_s=1)  # fmt: skip
    assert first.status == "timeout"
    with pytest.raises(IdempotencyKeyReused) as reused:
        await bridge.dispatch("u1", "click", {"selector": "b"}, idempotency_key="k1")
    _, http = bridge_error_answer(reused.value)
    with pytest.raises(MCPError) as refused:
        await _mcp_call(bridge, "click", {"selector": "b"}, {META_IDEMPOTENCY_KEY: "k1"})
    assert refused.value.error.code == types.INVALID_PARAMS
    assert http["error"]["field"] == "idempotency_key"
    assert refused.value.error.data == {
        "code": http["error"]["code"],
        "field": f"_meta.{META_IDEMPOTENCY_KEY}",
        "job_id": first.job_id,
    }
    assert http["error"]["job_id"] == first.job_id


class LateSubmit(MemorySubstrate):
    """A substrate whose enqueue step is sent at once but lands only when ``gate`` is
    set (Redis runs a script its caller has stopped waiting for): a cancelled caller
    returns at once, the entry appears later."""

    def __init__(self, nursery: trio.Nursery, **kw: Any) -> None:
        super().__init__(**kw)
        self.nursery = nursery
        self.armed = False
        self.gate = trio.Event()
        self.sent = trio.Event()

    async def submit(self, user_id: str, submission: Any) -> Any:
        if not self.armed:
            return await super().submit(user_id, submission)
        landed: list[Any] = []
        done = trio.Event()

        async def land() -> None:
            await self.gate.wait()
            landed.append(await MemorySubstrate.submit(self, user_id, submission))
            done.set()

        self.nursery.start_soon(land)
        self.sent.set()
        await done.wait()
        return landed[0]


async def test_an_abandoned_call_whose_enqueue_lands_later_never_starts(autojump_clock):
    seen: list[Any] = []
    async with trio.open_nursery() as nursery:
        substrate = LateSubmit(nursery, clock=wall)
        hub = HubState(substrate=substrate, timings=Timings(), consumer="hub-1", wall_clock=wall)
        peer = await connect(nursery, hub, [ToolSpec("click", "click", SCHEMA, True)])

        async def desk(frame: Any) -> None:
            seen.append(frame)
            if isinstance(frame, Job):
                await peer.send(JobResult(frame.id, True, result={"clicked": True}))

        nursery.start_soon(sidecar, peer, desk)
        via = Bridge(substrate, hub.timings, wall_clock=wall)
        warm = await _mcp_call(via, "click", {"selector": "#warm"})  # the holder is known
        assert not warm.is_error
        seen.clear()
        substrate.armed = True
        with trio.CancelScope() as abandoned:
            nursery.start_soon(_abandon_when_sent, substrate, abandoned)
            await _mcp_call(via, "click", {"selector": "#go"})
        substrate.gate.set()  # the enqueue step lands after the call gave up
        await trio.sleep(60)
        assert [type(f).__name__ for f in seen] == []  # never started on the desktop
        assert substrate.pending_count("u1") == 0
        nursery.cancel_scope.cancel()


async def _abandon_when_sent(substrate: LateSubmit, scope: trio.CancelScope) -> None:
    await substrate.sent.wait()
    await trio.sleep(0.1)
    scope.cancel()  # the client abandons the request (notifications/cancelled)


async def test_an_abandoned_call_keeps_the_job_another_caller_attached_to(
    autojump_clock,
    state,  # noqa: F811
    bridge,  # noqa: F811
):
    frames: list[Any] = []
    reached = trio.Event()
    async with trio.open_nursery() as nursery:
        peer = await connect(nursery, state, [ToolSpec("click", "click", SCHEMA, True)])

        async def desk(frame: Any) -> None:
            frames.append(frame)
            reached.set()

        nursery.start_soon(sidecar, peer, desk)
        meta = {"deskbridge/idempotency_key": "k-1"}
        with trio.CancelScope() as abandoned:
            nursery.start_soon(_abandon_once, reached, abandoned)
            await _mcp_call(bridge, "click", {"selector": "#go"}, meta)
        outcomes: list[Any] = []

        async def http_retry() -> None:  # the same request again, by its key
            outcomes.append(
                await bridge.dispatch(
                    "u1", "click", {"selector": "#go"}, idempotency_key="k-1", timeout_s=60
                )
            )

        nursery.start_soon(http_retry)
        await trio.sleep(5)
        [job] = [f for f in frames if isinstance(f, Job)]
        await peer.send(JobResult(job.id, True, result={"clicked": True}))
        await trio.testing.wait_all_tasks_blocked()
        assert [type(f).__name__ for f in frames] == ["Job"]  # no Cancel frame
        assert [(o.status, o.result) for o in outcomes] == [("completed", {"clicked": True})]
        nursery.cancel_scope.cancel()


async def _abandon_once(reached: trio.Event, scope: trio.CancelScope) -> None:
    await reached.wait()  # the job reached the desktop: then the client gives up
    scope.cancel()


class _Notes:
    """The part of the SDK's server session ``_call_tool`` uses to send progress."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, float | None, str | None]] = []

    async def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        self.sent.append((progress, total, message))


async def test_mcp_progress_only_ever_increases(autojump_clock):
    """MCP: "The progress value MUST increase with each notification". A tool's reports
    need not (the approval stage and then the run both start at 0, a tool may report 0
    first, or go back); they were relayed as they came. Now a report that does not
    increase is left out of ``notifications/progress`` (Bridge and SSE still get it)."""
    values = [0.0, 0.0, 1.0, 1.0, 0.5, 2.0, 3.0]

    class Reporting(Bridge):
        async def dispatch(self, *args: Any, on_progress: Any = None, **kw: Any) -> Any:
            for i, value in enumerate(values):
                await on_progress(ProgressReport(value, 3.0, f"step {i}"))
                await trio.sleep(1)
            return Outcome(job_id=kw["job_id"], status="completed", result={"ok": 1})

    notes = _Notes()
    ctx = pytypes.SimpleNamespace(params={"_meta": {"progressToken": "t"}}, session=notes)
    endpoint = UserEndpoint("u1", Reporting(MemorySubstrate()))
    got = await endpoint._call_tool(ctx, types.CallToolRequestParams(name="work", arguments={}))
    assert not got.is_error
    assert [p for p, _, _ in notes.sent] == [0.0, 1.0, 2.0, 3.0]
    assert [m for _, _, m in notes.sent] == ["step 0", "step 2", "step 5", "step 6"]


async def test_tools_list_gives_every_tool_an_object_input_schema(autojump_clock):
    """MCP: a tool's ``inputSchema`` is a JSON Schema whose ``type`` is ``"object"`` (a
    client validating the result, as the TypeScript SDK does, refuses the whole list
    otherwise). The hub vets a sidecar's ``args_schema`` only as a JSON Schema, so a
    desktop could announce ``{"type": "string"}`` or ``{"type": ["object", "null"]}``;
    both were listed as they came. A type list holding ``"object"`` is narrowed to it
    (``arguments`` are always an object); a schema no object can meet is a tool no call
    can reach (HTTP refuses every call's ``args`` with 400 too) and is not listed."""
    catalogue = [
        {"name": "plain", "args_schema": {"type": "object", "properties": {}}},
        {"name": "untyped", "args_schema": {"properties": {"a": {"type": "integer"}}}},
        {"name": "nullable", "args_schema": {"type": ["object", "null"]}},
        {"name": "stringy", "args_schema": {"type": "string"}},
        {"name": "listy", "args_schema": {"type": ["array", "string"]}},
    ]

    class Listing(Bridge):
        async def tools(self, user_id: str) -> Any:
            return catalogue

    endpoint = UserEndpoint("u1", Listing(MemorySubstrate()))
    listed = await endpoint._list_tools(None, None)
    by_name = {t.name: t.input_schema for t in listed.tools}
    assert set(by_name) == {"plain", "untyped", "nullable"}
    assert all(schema["type"] == "object" for schema in by_name.values())
    assert by_name["untyped"]["properties"] == {"a": {"type": "integer"}}


async def test_a_call_waiting_when_the_grace_ends_gets_an_error_result_naming_its_job(
    autojump_clock,
    state,  # noqa: F811
    bridge,  # noqa: F811
    caplog,
):
    """A graceful restart's grace ends while a tool call waits: the call gets an
    ``isError`` result, ``unavailable``, naming its job and stage (the job may still run),
    counted and logged once as ``unavailable``; the job is not withdrawn (no Cancel
    frame), unlike a call its client abandons (was: cut when the process exited)."""
    import logging

    from deskbridge_hub._shutdown import Draining

    caplog.set_level(logging.DEBUG, logger="deskbridge.hub.calls")
    drain = Draining()
    frames: list[Any] = []
    reached = trio.Event()
    async with trio.open_nursery() as nursery:
        peer = await connect(nursery, state, [ToolSpec("click", "click", SCHEMA, True)])

        async def desk(frame: Any) -> None:
            frames.append(frame)
            reached.set()

        nursery.start_soon(sidecar, peer, desk)

        async def grace_ends() -> None:
            await reached.wait()
            assert drain.release_calls() == 1

        nursery.start_soon(grace_ends)
        endpoint = UserEndpoint("u1", bridge, get_drain=lambda: drain)
        params = types.CallToolRequestParams(name="click", arguments={"selector": "#go"})
        got = await endpoint._call_tool(_ctx(), params)
        await trio.sleep(5)
        assert [type(f).__name__ for f in frames] == ["Job"]  # no Cancel frame
        nursery.cancel_scope.cancel()
    assert got.is_error
    body = got.structured_content
    assert body["status"] == "unavailable" and body["error"]["code"] == "unavailable"
    assert body["detail"] == {"stage": "delivered"}
    job_id = body["job_id"]
    assert job_id and f"GET /v1/jobs/{job_id}" in body["error"]["message"]
    lines = [r.getMessage() for r in caplog.records if r.name == "deskbridge.hub.calls"]
    assert lines == [f"call for job {job_id} answered: unavailable (click for u1)"]


@pytest.mark.parametrize(
    ("meta", "field", "says"),
    [
        ({"deskbridge/timeout_s": 0}, "_meta.deskbridge/timeout_s", "in (0, 86400]"),
        ({"deskbridge/timeout_s": -1}, "_meta.deskbridge/timeout_s", "in (0, 86400]"),
        ({"deskbridge/timeout_s": "5"}, "_meta.deskbridge/timeout_s", "must be a number"),
        ({"deskbridge/timeout_s": True}, "_meta.deskbridge/timeout_s", "must be a number"),
        ({"deskbridge/idempotency_key": 7}, "_meta.deskbridge/idempotency_key", "a string"),
    ],
    ids=["timeout 0", "timeout negative", "timeout string", "timeout bool", "key int"],
)
async def test_malformed_meta_is_invalid_params_with_http_s_code_and_field(
    autojump_clock,
    state,  # noqa: F811
    bridge,  # noqa: F811
    meta,
    field,
    says,
):
    """A newcomer pass: docs/mcp.md says the hub's own refusals carry HTTP's code and
    field as ``data`` and name the field; a malformed ``_meta`` value had no ``data`` at
    all, and a string timeout was told it "must be in (0, 86400]" (HTTP says "must be a
    number"). Nothing is enqueued."""
    async with trio.open_nursery() as nursery:
        peer = await connect(nursery, state, [ToolSpec("click", "click", SCHEMA, True)])
        nursery.start_soon(sidecar, peer, ignore)
        with pytest.raises(MCPError) as refused:
            await _mcp_call(bridge, "click", {"selector": "a"}, meta)
        error = refused.value.error
        assert error.code == types.INVALID_PARAMS
        assert error.data == {"code": "bad_request", "field": field}
        assert error.message.startswith(f"{field}: ") and says in error.message, error.message
        assert state.substrate.pending_count("u1") == 0
        nursery.cancel_scope.cancel()
