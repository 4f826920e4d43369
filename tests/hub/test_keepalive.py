"""``_keepalive.RunningJobs``: what it extends, how often, and what it does when the
store does not answer (MockClock, a recording fake substrate)."""

from __future__ import annotations

import trio
from deskbridge_hub._errors import SubstrateUnavailable
from deskbridge_hub._keepalive import KEEP_SHARE, RunningJobs


class Recording:
    """Records each ``keep_job``; fails the calls listed in ``fail`` (by call number)."""

    def __init__(self, fail: set[int] | None = None, error: Exception | None = None) -> None:
        self.calls: list[tuple[float, str, str, float, str | None]] = []
        self.fail = fail or set()
        self.error = error or SubstrateUnavailable("down (test)")

    async def keep_job(
        self, user_id: str, job_id: str, *, ttl_s: float, idempotency_key: str | None = None
    ) -> None:
        self.calls.append((trio.current_time(), user_id, job_id, ttl_s, idempotency_key))
        if len(self.calls) in self.fail:
            raise self.error


def _two_jobs_kept(nursery: trio.Nursery, store: Recording) -> None:
    """Jobs j1 (of u1) and j2 (of u2) served, their records kept in ``nursery``."""
    running = RunningJobs(store, 300.0)  # type: ignore[arg-type]
    running.add("u1", "j1", None)
    running.add("u2", "j2", None)
    nursery.start_soon(running.run)


async def test_the_jobs_served_are_kept_every_share_of_the_ttl_until_discarded(autojump_clock):
    store = Recording()
    running = RunningJobs(store, 300.0)  # type: ignore[arg-type]
    running.add("u1", "j1", "k1")
    running.add("u1", "j1", "k1")  # a second delivery of it, served here too
    running.add("u2", "j2", None)
    assert KEEP_SHARE == 4 and len(running) == 2
    async with trio.open_nursery() as nursery:
        nursery.start_soon(running.run)
        await trio.sleep(75 - 0.001)
        assert store.calls == []
        await trio.sleep(0.002)
        assert [c[1:] for c in store.calls] == [
            ("u1", "j1", 300.0, "k1"), ("u2", "j2", 300.0, None)
        ]  # fmt: skip
        running.discard("u1", "j1", "k1")  # one delivery ended: still served
        running.discard("u2", "j2", None)
        await trio.sleep(75)
        assert [c[1:3] for c in store.calls[2:]] == [("u1", "j1")]
        running.discard("u1", "j1", "k1")
        assert len(running) == 0
        await trio.sleep(75)
        assert len(store.calls) == 3
        nursery.cancel_scope.cancel()


async def test_a_round_stops_at_a_store_that_does_not_answer_and_the_next_one_tries_again(
    autojump_clock,
):
    store = Recording(fail={1})
    async with trio.open_nursery() as nursery:
        _two_jobs_kept(nursery, store)
        await trio.sleep(76)
        assert [c[2] for c in store.calls] == ["j1"]  # j2 not tried after the failure
        await trio.sleep(75)
        assert [c[2] for c in store.calls] == ["j1", "j1", "j2"]
        nursery.cancel_scope.cancel()


async def test_an_unexpected_failure_does_not_end_the_loop(autojump_clock):
    """Something other than an outage (a refusal the client does not map, a bug): the
    loop runs in the process reader's nursery, so raising ended every session of the
    process (the reader's other loops log and go on: ``ProcessReader._unexpected``).
    Now it is logged, that job's round goes on with the others, and the next round
    tries again."""
    store = Recording(fail={1}, error=RuntimeError("ERR unknown option (test)"))
    async with trio.open_nursery() as nursery:
        _two_jobs_kept(nursery, store)
        await trio.sleep(76)
        assert [c[2] for c in store.calls] == ["j1", "j2"]
        await trio.sleep(75)
        assert [c[2] for c in store.calls] == ["j1", "j2", "j1", "j2"]
        nursery.cancel_scope.cancel()


# -- a forwarded chosen id's owner record (``keep_id``) -------------------------------------


class KeepingIds:
    """Records each ``keep_job_ids`` batch; refuses it (``error``) while ``down``."""

    def __init__(self, error: Exception | None = None) -> None:
        self.batches: list[tuple[bool, list[str]]] = []  # (refused, ids)
        self.down = True
        self.error = error or SubstrateUnavailable("down (test)")

    async def keep_job_ids(self, job_ids: list[str], *, ttl_s: float) -> None:
        await trio.lowlevel.checkpoint()
        self.batches.append((self.down, list(job_ids)))
        if self.down:
            raise type(self.error)(*self.error.args)  # a fresh one each time

    async def keep_job(self, *args: object, **kwargs: object) -> None:
        pass


async def test_a_refused_keep_of_an_id_is_not_sent_again_once_its_delivery_ended(
    autojump_clock,
):
    """The store refuses the keeps for a minute (under Cluster: one node down fails the
    whole split write) while forwarded jobs with chosen ids come and are answered (their
    answer's write set each owner record to the result TTL, or the ``interrupted`` write
    kept it as long as the state). Only a delivery still served here needs its keep sent
    again. Was: every id refused was sent again each second for as long as the store
    refused, the pending set grew with every forwarded chosen id (every MCP call's id is
    one), and once the store took writes again every job answered meanwhile had its id
    taken a day."""
    store = KeepingIds()
    running = RunningJobs(store, 300.0)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(running.run)
        running.add("u1", "served", None)
        running.keep_id("served")
        for n in range(60):  # one job a second, forwarded and answered
            await trio.sleep(1)
            running.add("u1", f"answered-{n}", None)
            running.keep_id(f"answered-{n}")
            await trio.sleep(0.5)
            running.discard("u1", f"answered-{n}", None)
        store.down = False
        await trio.sleep(5)
        sent = [ids for refused, ids in store.batches if not refused]
        assert sent == [["served"]], sent  # the answered ones: their own write
        assert max(len(ids) for _, ids in store.batches) <= 2  # bounded by the served
        nursery.cancel_scope.cancel()


async def test_an_unexpected_failure_of_the_ids_keep_is_logged_once(autojump_clock, caplog):
    """Not an outage (a bug, an unmapped refusal): logged with its traceback once until
    a keep works, as the running jobs' keep does. Was: one traceback each second."""
    store = KeepingIds(error=RuntimeError("ERR unknown option (test)"))
    running = RunningJobs(store, 300.0)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(running.run)
        running.add("u1", "served", None)
        running.keep_id("served")
        await trio.sleep(30)
        assert len(store.batches) >= 20  # tried again each second
        failures = [r for r in caplog.records if r.name == "deskbridge.hub.keepalive"]
        assert len(failures) == 1, [r.getMessage() for r in failures]
        store.down = False
        await trio.sleep(2)
        assert store.batches[-1] == (False, ["served"])
        nursery.cancel_scope.cancel()
