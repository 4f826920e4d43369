"""The caller's submit step, on MemorySubstrate and MockClock (autojump): a caller's
``timeout_s`` bounds the submit too (a Redis that stalls answers within its command
timeout, 5 s, later than the caller wanted), an unanswered submit is told as an outcome
unknown with the job's id, and a refused call leaves its caller-chosen job id free.
Real Redis frozen for real: tests/hub/test_submit_stall.py."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from deskbridge_common import Timings
from deskbridge_hub import BadRequest, Bridge, IdempotencyKeyReused, JobTimeout
from deskbridge_hub._errors import SubstrateUnavailable
from deskbridge_hub._memory import MemorySubstrate
from deskbridge_hub._retry import ANSWER_GRACE_S
from deskbridge_hub._substrate import Submission, Submitted, owner_key

from tests.hub.test_session import wall

CATALOGUE = (
    '[{"name": "echo", "args_schema": {"type": "object", "properties": {"x": {"type": "string"}}}}]'
)


class Stalling(MemorySubstrate):
    """A MemorySubstrate whose ``submit`` can be made to hang (the command sits in a
    stalled Redis) or to fail after it may have run (a connection dropped after the
    write)."""

    stall: trio.Event | None = None
    fail: bool = False
    unsent: bool = False  # the failure is a connection that could not be made
    sent: list[Submission]

    async def submit(self, user_id: str, submission: Submission) -> Submitted:
        self.sent.append(submission)
        if self.stall is not None:
            await self.stall.wait()
        if self.fail:
            exc = SubstrateUnavailable("Redis at 127.0.0.1:1 did not answer the submit")
            exc.unsent = self.unsent
            raise exc
        return await super().submit(user_id, submission)


@pytest.fixture
async def substrate() -> Stalling:
    s = Stalling(clock=wall)
    s.sent = []
    await s.set_presence("u1", "s1", 3600)
    await s.set_catalogue("u1", CATALOGUE)
    return s


@pytest.fixture
def bridge(substrate: Stalling) -> Bridge:
    return Bridge(substrate, Timings(), wall_clock=wall)


async def test_a_stalled_submit_is_answered_timeout_unknown_by_the_callers_time(
    autojump_clock: Any, substrate: Stalling, bridge: Bridge
) -> None:
    substrate.stall = trio.Event()  # never set: the submit is out, unanswered
    start = trio.current_time()
    outcome = await bridge.dispatch("u1", "echo", {}, timeout_s=1.0)
    assert trio.current_time() - start <= 1.0 + ANSWER_GRACE_S
    assert outcome.status == "timeout" and outcome.detail == {"stage": "unknown"}
    assert outcome.job_id == substrate.sent[0].job_id  # to look it up
    assert "outcome unknown" in (outcome.error or {})["message"]
    # the submit carried the caller's time left: a step that runs after it refuses
    assert substrate.sent[0].give_up_s == pytest.approx(1.0)
    with pytest.raises(JobTimeout) as info:
        await bridge.call("u1", "echo", {}, timeout_s=2.0)
    assert info.value.details["stage"] == "unknown"
    assert trio.current_time() - start <= 3.0 + 2 * ANSWER_GRACE_S


async def test_a_submit_that_fails_after_it_may_have_run_names_its_job(
    autojump_clock: Any, substrate: Stalling, bridge: Bridge
) -> None:
    """SubstrateUnavailable from the submit itself: the job may be enqueued, so the
    caller gets its id (was the short answer of a call that enqueued nothing)."""
    substrate.fail = True
    with pytest.raises(SubstrateUnavailable) as info:
        await bridge.dispatch("u1", "echo", {}, job_id="order-7")
    assert info.value.job_id == "order-7"
    # its id stays claimed: the job may exist
    assert await substrate.job_owner("order-7") is not None


async def test_a_submit_that_could_not_connect_names_no_job_and_frees_its_id(
    autojump_clock: Any, substrate: Stalling, bridge: Bridge
) -> None:
    """Found by a newcomer: Redis down (connection refused) during the submit was
    answered as "may have been enqueued", naming a job that could not exist. No
    connection made, nothing sent: the short answer, and the caller's id is free."""
    substrate.fail = substrate.unsent = True
    with pytest.raises(SubstrateUnavailable) as info:
        await bridge.dispatch("u1", "echo", {}, job_id="order-8")
    assert info.value.job_id is None
    assert await substrate.job_owner("order-8") is None


async def test_the_job_starts_within_the_callers_time_not_after_the_submit(
    autojump_clock: Any, substrate: Stalling, bridge: Bridge
) -> None:
    """A submit sent late in the caller's time (a holder's second look, a catalogue
    read) gets the start window that is left, so the job's deadline is the caller's."""
    await substrate.set_presence("u1", "cafe.s1", 3600)  # a holder that is dead at first

    async def comes_back() -> None:
        await trio.sleep(0.5)
        await substrate.set_liveness("cafe", 3.0)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(comes_back)
        outcome = await bridge.dispatch("u1", "echo", {}, timeout_s=5.0)
    assert outcome.status == "timeout" and outcome.detail["stage"] == "queued"
    last = substrate.sent[-1]
    assert last.alive_holder == "cafe"
    assert last.start_within_s == pytest.approx(5.0 - 1.0)  # after the 1 s second look
    assert last.give_up_s == pytest.approx(5.0 - 1.0)


@pytest.mark.parametrize(
    "refusal", ["unknown tool", "bad args", "offline", "reused key", "catalogue changed"]
)
async def test_a_refused_call_leaves_its_job_id_free(
    autojump_clock: Any, substrate: Stalling, bridge: Bridge, refusal: str
) -> None:
    """The caller-chosen id was claimed before the call was refused: it named no job,
    and kept the id taken (a retry with it was JobIdInUse) until the claim's TTL."""
    name, args, key = "echo", {}, None
    if refusal == "unknown tool":
        name = "click"
    elif refusal == "bad args":
        args = {"x": 1}
    elif refusal == "offline":
        await substrate.clear_presence("u1", "s1")
    elif refusal == "reused key":
        await bridge.dispatch("u1", "echo", {"a": 1}, idempotency_key="k", timeout_s=0.1)
        args, key = {"a": 2}, "k"
    else:  # the desktop's catalogue changed and no longer has the tool
        assert (await bridge.dispatch("u1", "echo", {}, timeout_s=0.1)).status == "timeout"
        await substrate.set_catalogue("u1", '[{"name": "click"}]')
    with trio.fail_after(60):
        try:
            outcome = await bridge.dispatch(
                "u1", name, args, job_id="order-9", idempotency_key=key, timeout_s=0.5
            )
        except (BadRequest, IdempotencyKeyReused):
            pass
        else:
            assert outcome.status == "offline", outcome
    assert owner_key("order-9") not in substrate._kv
    assert await substrate.job_owner("order-9") is None


async def test_a_call_attached_by_its_key_leaves_its_own_job_id_free(
    autojump_clock: Any, substrate: Stalling, bridge: Bridge
) -> None:
    first = await bridge.dispatch("u1", "echo", {}, idempotency_key="k", timeout_s=0.1)
    again = await bridge.dispatch(
        "u1", "echo", {}, idempotency_key="k", job_id="order-10", timeout_s=0.1
    )
    assert again.job_id == first.job_id != "order-10"
    assert await substrate.job_owner("order-10") is None
