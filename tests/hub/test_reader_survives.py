"""The process reader's process-wide loops survive what is not an outage (MemorySubstrate,
MockClock): a Cluster error coredis raised unmapped (CLUSTERDOWN while a primary was down
for seconds) escaped the wake-up and liveness loops and ended every hub process."""

from __future__ import annotations

import logging

import trio

from .test_session import answer_jobs, connect, enqueue, make_state


class Flaky:
    """Wrap ``state.substrate.<name>``: raise a non-outage error while ``failing`` holds."""

    def __init__(self, state, name: str) -> None:
        self.real = getattr(state.substrate, name)
        self.failing = False
        self.calls = 0
        setattr(state.substrate, name, self)

    async def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.failing:
            raise RuntimeError("ClusterDownError: The cluster is down")
        return await self.real(*args, **kwargs)


async def test_the_wake_loop_and_the_liveness_loop_outlive_unexpected_errors(
    autojump_clock, caplog
):
    state = make_state()
    wakes = Flaky(state, "wait_wakes")
    liveness = Flaky(state, "set_liveness")
    with caplog.at_level(logging.INFO, logger="deskbridge.hub.reader"):
        async with trio.open_nursery() as nursery:
            peer, _ = await connect(nursery, state, "u1")
            executed: list = []
            nursery.start_soon(answer_jobs, peer, executed)
            wakes.failing = liveness.failing = True
            before = wakes.calls, liveness.calls
            # A minute of liveness failures: longer (past the presence TTL, 90 s) and
            # the process would end its sessions, as cut off from Redis (``_reader``)
            await trio.sleep(60)
            liveness.failing = False
            liveness_tries = liveness.calls - before[1]
            await trio.sleep(60)  # two minutes of it: retried with backoff, not a spin
            tries = wakes.calls - before[0], liveness_tries
            # the wake-up loop backs off to 30 s; the liveness loop to 1 s (past its 3 s
            # TTL every desktop of the process would read offline)
            assert 3 <= tries[0] <= 12 and 30 <= tries[1] <= 62, tries
            wakes.failing = False
            await trio.sleep(31)  # the longest backoff
            await enqueue(state, "u1", "echo", {"n": 1})
            with trio.fail_after(60):  # a wake-up, or at worst the next heartbeat's backlog
                while not executed:  # noqa: ASYNC110 - the peer task records it
                    await trio.sleep(0.05)
            assert executed[0].args == {"n": 1}
            nursery.cancel_scope.cancel()
    unexpected = [r for r in caplog.records if "failed unexpectedly" in r.getMessage()]
    assert sorted(r.getMessage().split(" failed")[0] for r in unexpected) == [
        "liveness refresh",
        "wake-up wait",
    ]  # one traceback per loop and streak, not one per try
    assert "wake-up wait works again" in caplog.text
