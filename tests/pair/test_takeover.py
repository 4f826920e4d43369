"""Instant takeover (issue 12.4), end to end on MockClock: the real sidecar daemon against
two real hub "processes" (two ``HubState``s, each with its own reader and consumer name)
sharing one ``MemorySubstrate``, with the default timings (reclaim idle 180 s).

A process "killed" (kill -9) stops without any cleanup: its view of the substrate starts
failing first (no presence clear, no interrupted mark, no liveness clear), then its tasks
are cancelled; its socket dies without a close frame.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

import trio
import trio.testing
from deskbridge_common import Timings
from deskbridge_hub import Bridge
from deskbridge_hub._errors import SubstrateUnavailable
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._session import HubState
from deskbridge_sidecar import Daemon, ToolRegistry, tool

from tests.pair import TOKEN, USER, PairConnector, wall

TIMINGS = Timings()  # the defaults: reclaim idle 180 s, heartbeat 10 s
JOB_S = 30.0


class Killable:
    """One process's view of the shared substrate: after ``kill()`` every call fails."""

    def __init__(self, inner: MemorySubstrate):
        self._inner = inner
        self.dead = False

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not inspect.iscoroutinefunction(attr):
            return attr  # values and plain methods (``history_changes``) as they are

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.dead:
                await trio.lowlevel.checkpoint()
                raise SubstrateUnavailable("process killed")
            return await attr(*args, **kwargs)

        return call


async def _pod(state: HubState, *, task_status: trio.TaskStatus[trio.Nursery]) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(state.reader.run)
        task_status.started(nursery)
        await trio.sleep_forever()


def _submit_tool():
    calls: list[float] = []

    @tool(side_effects=True)
    async def submit(form: str) -> dict:
        calls.append(trio.current_time())
        await trio.sleep(JOB_S)
        return {"submitted": form, "n": len(calls)}

    return submit, calls


def _two_pods() -> tuple[MemorySubstrate, Killable, HubState, HubState]:
    """One shared substrate; pod-1 sees it through a :class:`Killable` view (its kill -9),
    pod-2 directly."""
    substrate = MemorySubstrate(clock=wall)
    view1 = Killable(substrate)
    pod1 = HubState(substrate=view1, timings=TIMINGS, consumer="pod-1", wall_clock=wall)  # type: ignore[arg-type]
    pod2 = HubState(substrate=substrate, timings=TIMINGS, consumer="pod-2", wall_clock=wall)
    return substrate, view1, pod1, pod2


def _desktop(submit: Any, connector: PairConnector) -> Daemon:
    """The real sidecar daemon with only ``submit``, dialling through ``connector``."""
    return Daemon(
        "ws://hub.pair:8080", TOKEN, registry=ToolRegistry([submit]), timings=TIMINGS,
        wall_clock=wall, connector=connector, random=lambda: 0.5,
    )  # fmt: skip


async def _wait_sessions(daemon: Daemon, count: int) -> None:
    with trio.fail_after(60):
        while daemon.statistics().sessions_started < count:  # noqa: ASYNC110 - test poll
            await trio.sleep(0.01)


async def _scenario(
    *, kill_pod1: bool, same_daemon: bool, timeout_s: float = 600
) -> dict[str, Any]:
    """pod-1 holds the socket; a 30 s job (the call waits ``timeout_s``) starts at t=0;
    at t=5 pod-1 dies (or only the socket does); the desktop connects to pod-2 (the same
    daemon, or a different one). ``answer``: the job's stored answer, once it has one
    (looked for until the reclaim idle has passed twice)."""
    substrate, view1, pod1, pod2 = _two_pods()
    submit, calls = _submit_tool()
    outcomes = []
    async with trio.open_nursery() as root:
        n1 = await root.start(_pod, pod1)
        n2 = await root.start(_pod, pod2)
        connector = PairConnector(pod1, n1, USER)

        def daemon(conn: PairConnector) -> Daemon:
            return _desktop(submit, conn)

        first = daemon(connector)
        first_scope = trio.CancelScope()

        async def run_first(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED):
            with first_scope:
                await first.run(task_status=task_status)

        await root.start(run_first)
        bridge = Bridge(substrate, TIMINGS, wall_clock=wall)  # a caller on pod-2's side

        async def caller() -> None:
            outcomes.append(
                await bridge.dispatch(USER, "submit", {"form": "f"}, timeout_s=timeout_s)
            )

        root.start_soon(caller)
        await trio.sleep(5)
        assert first.statistics().running == "submit"
        if kill_pod1:
            view1.dead = True
            n1.cancel_scope.cancel()
        connector.state, connector.nursery = pod2, n2
        if same_daemon:
            connector.sockets[-1].abort()  # the network dies under the socket
            await _wait_sessions(first, 2)
        else:
            first_scope.cancel()  # this desktop is gone; another one connects
            connector.sockets[-1].abort()
            second = daemon(PairConnector(pod2, n2, USER))
            await root.start(second.run)
        reconnected_at = trio.current_time()
        with trio.fail_after(600):
            while not outcomes:  # noqa: ASYNC110 - test poll
                await trio.sleep(0.5)
        answer = None
        with trio.move_on_after(2 * TIMINGS.reclaim_idle_s):
            while (answer := await bridge.answer_of(outcomes[0].job_id)) is None:  # noqa: ASYNC110
                await trio.sleep(1)
        root.cancel_scope.cancel()
    return {
        "outcome": outcomes[0], "calls": calls, "reconnected_at": reconnected_at,
        "answer": None if answer is None else json.loads(answer),
    }  # fmt: skip


async def test_kill_9_of_the_holding_process_the_same_daemon_takes_over_at_once(
    autojump_clock,
):
    """Default reclaim idle (180 s): the caller has the result within 2 s of the tool's
    end (the redelivery joined the running run), not 180 s later; it ran once."""
    got = await _scenario(kill_pod1=True, same_daemon=True)
    outcome, calls = got["outcome"], got["calls"]
    assert outcome.status == "completed", outcome
    assert outcome.result == {"submitted": "f", "n": 1}
    assert calls == [calls[0]]  # started once
    tool_end = calls[0] + JOB_S
    assert outcome.elapsed_s <= tool_end + 2.0, outcome.elapsed_s


async def test_socket_gone_while_the_old_process_lives_the_same_daemon_takes_over(
    autojump_clock,
):
    """pod-1 is alive, only the socket died and the desktop came back through pod-2
    (presence replaced): the same daemon takes over at once too."""
    got = await _scenario(kill_pod1=False, same_daemon=True)
    outcome, calls = got["outcome"], got["calls"]
    assert outcome.status == "completed", outcome
    assert len(calls) == 1
    assert outcome.elapsed_s <= calls[0] + JOB_S + 2.0, outcome.elapsed_s


async def test_a_different_daemon_waits_the_reclaim_idle(autojump_clock):
    """Another daemon (its own ledger) connects after pod-1's kill -9: nothing is taken
    over early; the entry reaches it only after the reclaim idle (180 s), where the old
    rules apply (it runs again: that desktop never saw it)."""
    got = await _scenario(kill_pod1=True, same_daemon=False)
    outcome, calls = got["outcome"], got["calls"]
    assert outcome.status == "completed", outcome
    assert len(calls) == 2
    assert calls[1] - calls[0] >= TIMINGS.reclaim_idle_s
    assert calls[1] - got["reconnected_at"] > 150  # not at the reconnect


async def test_a_different_daemon_refusing_the_job_as_late_makes_it_in_doubt(autojump_clock):
    """As above, but the call waits 60 s: when the reclaim hands the entry to the other
    daemon (180 s) its deadline has passed, and that desktop's runner refuses to start
    it. Before, the job's answer was ``expired`` ("did not run"), though the first
    desktop had started it; now ``in_doubt``. It ran once (on the first desktop)."""
    got = await _scenario(kill_pod1=True, same_daemon=False, timeout_s=60)
    outcome, calls, answer = got["outcome"], got["calls"], got["answer"]
    assert outcome.status == "timeout", outcome
    assert answer is not None and answer["status"] == "in_doubt", answer
    assert len(calls) == 1
