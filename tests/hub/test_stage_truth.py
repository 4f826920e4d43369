"""A job's ``timeout`` and ``interrupted`` answers say only what the hub knows of its
start (``JobState.running``). Found by fault injection: a sidecar SIGSTOPped 20 s with
one job running and two more delivered behind it (one queued in its serial worker, one
never read from the socket); both 5 s callers were told "delivered and running when the
desktop went away", though neither had started. The desktop reports ``running`` in a
``progress`` frame (``_desk_stage``); without that report the job is only "delivered,
not known to have started". MockClock, memory substrate, a fake sidecar (executor)."""

from __future__ import annotations

import json
import types

import trio
import trio.testing
from deskbridge_common import STAGE_RUNNING, Job, JobResult, Timings
from deskbridge_hub import Bridge
from deskbridge_hub._delivery import EntryServer
from deskbridge_hub._desk_stage import Outstanding, stage_recorder
from deskbridge_hub._jobs import interrupted_payload
from deskbridge_hub._memory import MemorySubstrate

EPOCH = 1_700_000_000.0
USER = "u1"


def wall() -> float:
    return EPOCH + trio.current_time()


class _SilentSidecar:
    """Receives each job, reports ``running`` for it if asked to, then says nothing
    more (asleep); its socket goes away at ``gone`` (the deliveries are cancelled)."""

    def __init__(self, substrate: MemorySubstrate, *, reports_running: bool) -> None:
        self.hub = types.SimpleNamespace(substrate=substrate, timings=Timings(), wall_clock=wall)
        self.reports_running = reports_running
        self.gone = trio.Event()
        self._ran: set[str] = set()

    async def execute(self, job: Job, *, epoch: int | None = None) -> JobResult:
        delivery = Outstanding(job_id=job.job_id, epoch=epoch)
        record = stage_recorder(self.hub, USER, job.job_id, "s1", epoch)  # type: ignore[arg-type]
        try:
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:

                    async def socket_gone() -> None:
                        await self.gone.wait()
                        scope.cancel()

                    nursery.start_soon(socket_gone)
                    if self.reports_running:
                        delivery.report(STAGE_RUNNING)
                    await delivery.wait(record)  # never answered
            raise trio.Cancelled._create()  # the socket went away with it
        finally:
            if getattr(delivery, "running", False):  # (older hubs: no such field)
                self._ran.add(job.job_id)

    async def cancel(self, job_id: str) -> None: ...

    def ended_reason(self) -> None:
        return None

    def reported_running(self, job_id: str) -> bool:
        return job_id in self._ran


async def _call_while_the_desktop_sleeps(reports_running: bool) -> tuple[object, object]:
    substrate = MemorySubstrate(clock=wall)
    await substrate.set_presence(USER, "s1", 3600)
    bridge = Bridge(substrate, wall_clock=wall)
    sidecar = _SilentSidecar(substrate, reports_running=reports_running)
    server = EntryServer(substrate, Timings(), USER, "s1", wall)
    got = []

    async def caller() -> None:
        got.append(await bridge.dispatch(USER, "echo", {}, job_id="j1", timeout_s=5))

    async def serve() -> None:
        with trio.move_on_after(10):
            (entry,) = await substrate.read_new(USER, "hub-1", count=10, block_ms=1000)
            try:
                await server.serve(entry, sidecar)
            except trio.Cancelled:
                pass

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(serve)
            await trio.sleep(2)
            sidecar.gone.set()  # the keepalive gave up on the sleeping desktop
    state = await substrate.get_job_state(USER, "j1")
    return got[0], state


async def test_a_job_never_reported_running_is_only_delivered_not_known_started(autojump_clock):
    outcome, state = await _call_while_the_desktop_sleeps(reports_running=False)
    assert outcome.status == "timeout" and outcome.detail == {"stage": "interrupted"}
    message = outcome.error["message"]
    assert "not known to have started" in message and "running" not in message, message
    assert "may have" in message  # never "did not run": the hub cannot tell
    assert state.stage == "interrupted" and not state.running


async def test_a_job_the_desktop_reported_running_is_said_to_have_run(autojump_clock):
    outcome, state = await _call_while_the_desktop_sleeps(reports_running=True)
    assert outcome.status == "timeout" and outcome.detail == {"stage": "interrupted"}
    message = outcome.error["message"]
    assert "reported the job running" in message and "may have acted" in message, message
    assert state.stage == "interrupted" and state.running
    assert json.loads(state.encode())["running"] is True


def test_the_interrupted_answer_claims_a_run_only_when_one_was_reported():
    for pending in (True, False):
        quiet = json.loads(interrupted_payload("expired", pending=pending))
        assert "while the job ran" not in quiet["error"]["message"]
        assert "not known to have started" in quiet["error"]["message"]
        assert "may have acted" in quiet["error"]["message"]
        ran = json.loads(interrupted_payload("expired", pending=pending, running=True))
        assert "while the job ran" in ran["error"]["message"]
        assert quiet["detail"] == ran["detail"]  # the public shape is the same
