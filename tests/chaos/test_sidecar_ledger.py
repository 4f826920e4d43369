"""Issue 12 item 1 on real processes: the sidecar's durable ledger.

* 400 keyed jobs (``timeout_s=300``), then Redis rewound to an earlier copy of its AOF
  (its own ``redis-server --appendonly yes``; the AOF directory copied once all 400 are
  enqueued behind a first 8 s job, restored after all of them completed): the rewound
  stream redelivers all 400, and none runs again. The old in-memory cache (256
  outcomes) would run the oldest 144 twice (49 of 400 in the field).
* kill -9 of the sidecar mid-job, restart on the same data directory, redelivery: the
  caller is answered ``in_doubt`` (409) and the tool does not run again.

The oracle is the counting tool's own file (one line per start), not the sidecar's word.
"""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.chaos._harness import TIMINGS, new_user, post_job, wait_online
from tests.procs import Ledger, Proc, Sidecar, free_port, issue, resp_command, wait_until

pytestmark = pytest.mark.chaos


class AofRedis(Proc):
    """A private ``redis-server`` that keeps an AOF (fsync always) in ``workdir``."""

    def __init__(self, tmp: Path, workdir: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.workdir = workdir
        workdir.mkdir(exist_ok=True)
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "yes", "--appendfsync", "always",
                "--dir", str(workdir)]  # fmt: skip
        super().__init__(argv, {}, tmp / f"aof-redis-{self.port}-{time.time_ns()}.log")

    def command(self, *command: object):
        return resp_command("127.0.0.1", self.port, *command)

    def wait_ready(self) -> None:
        def ok():
            if self.popen.poll() is not None:
                raise RuntimeError(f"redis-server exited {self.popen.returncode}")
            return self.command("PING") == "PONG"

        wait_until(ok, timeout_s=15, what=f"redis-server on {self.port}")


def _unacked(redis: AofRedis, user: str) -> int:
    """Entries of the user's stream the consumer group has not acknowledged: pending
    plus never delivered (after ``last-delivered-id``; ``lag`` may be null in Redis 7.0
    once entries were deleted, so count them)."""
    stream = f"bridge:jobs:{{{user}}}"
    info = redis.command("XINFO", "GROUPS", stream)
    if not info:
        return -1
    fields = dict(zip(info[0][::2], info[0][1::2], strict=False))
    unread = redis.command("XRANGE", stream, "(" + fields["last-delivered-id"], "+")
    return int(fields["pending"]) + len(unread or [])


def _enqueue_only_waiters():
    """Result waiters that never wait: ``Bridge.dispatch`` returns (``timeout``) right
    after its enqueue. 400 callers waiting for their results would test the machine, not
    the ledger."""
    from deskbridge_hub._waiting import ResultWaiters

    class EnqueueOnly(ResultWaiters):
        async def wait(self, waiter, *, timeout_s, attached=False):
            return None

    return EnqueueOnly


def _enqueue_all(
    redis_url: str, user: str, keys: list[str], seconds: float = 0.0, limit: int = 20
) -> list[str]:
    """``Bridge.dispatch`` of ``record`` for every key (``timeout_s=300``), ``limit`` at
    a time, returning once each is enqueued; returns the statuses."""
    import trio
    from deskbridge_hub import Bridge, RedisSubstrate

    async def main() -> list[str]:
        statuses = [""] * len(keys)
        limiter = trio.CapacityLimiter(limit)
        substrate = RedisSubstrate.from_url(redis_url)
        async with substrate:
            bridge = Bridge(substrate)
            bridge.waiters = _enqueue_only_waiters()(substrate)

            async def one(i: int, key: str) -> None:
                async with limiter:
                    outcome = await bridge.dispatch(
                        user,
                        "record",
                        {"key": key, "seconds": seconds},
                        idempotency_key=key,
                        timeout_s=300,
                    )
                statuses[i] = outcome.status

            with trio.fail_after(120):
                async with trio.open_nursery() as nursery:
                    for i, key in enumerate(keys):
                        nursery.start_soon(one, i, key)
        return statuses

    return trio.run(main)


def test_redis_rewound_to_an_older_aof_runs_nothing_twice(tmp_path, procs):
    n_jobs = 400
    user = new_user()
    ledger = Ledger(tmp_path / "ledger.jsonl")
    redis = procs.add(AofRedis(tmp_path, tmp_path / "redis-data"))
    redis.wait_ready()
    env = {**TIMINGS, "DESKBRIDGE_REDIS_URL": redis.url}
    hub = procs.hub(tmp_path, env, name="pod")
    sidecar = procs.add(Sidecar(tmp_path, hub.ws, issue(user), tools=["counting_tools"],
                                env={**env, **ledger.env()}))  # fmt: skip
    wait_online(hub.http, user)
    keys = [f"aof{i:03d}-{user}" for i in range(n_jobs)]
    copy = tmp_path / "aof-copy"
    # a first job holds the (serial) sidecar for a few seconds while the 400 are enqueued
    gate = "gate-" + user
    assert _enqueue_all(redis.url, user, [gate], seconds=8.0) == ["timeout"]
    wait_until(lambda: ledger.starts(gate), timeout_s=30, what="the gate job started")
    statuses = _enqueue_all(redis.url, user, keys)  # nobody waits: enqueued only
    assert statuses == ["timeout"] * n_jobs, statuses[:3]
    assert not ledger.ends(gate), "enqueueing took longer than the gate job"
    shutil.copytree(redis.workdir / "appendonlydir", copy)  # the "earlier copy"
    wait_until(lambda: len(ledger.counts()) == n_jobs + 1 and _unacked(redis, user) == 0,
               timeout_s=300, interval_s=0.5, what="all 400 ran and were acknowledged")  # fmt: skip
    assert set(ledger.counts().values()) == {1}

    # rewind: stop Redis, put the old AOF back, start it on the same port
    redis.signal_group(signal.SIGKILL)
    redis.popen.wait(10)
    shutil.rmtree(redis.workdir / "appendonlydir")
    shutil.copytree(copy, redis.workdir / "appendonlydir")
    rewound = procs.add(AofRedis(tmp_path, redis.workdir, port=redis.port))
    rewound.wait_ready()
    unacked = _unacked(rewound, user)
    assert unacked > 256, unacked  # more than the old cache could have remembered

    # the hub redelivers every entry the rewound group has not acknowledged
    wait_until(lambda: _unacked(rewound, user) == 0, timeout_s=180, interval_s=0.5,
               what="every redelivery answered and acknowledged")  # fmt: skip
    counts = ledger.counts()
    assert len(counts) == n_jobs + 1
    log = sidecar.output()  # the redeliveries did reach the sidecar, and were answered
    answered = log.count("(record): ok") + log.count("(record): answered at once")
    assert answered >= n_jobs + unacked, (answered, unacked)
    twice = sorted(k for k, c in counts.items() if c > 1)
    assert twice == [], f"{len(twice)} keys ran twice: {twice[:5]}"
    print(f"\nAOF rewind: {unacked}+ entries redelivered after the rewind, 0 re-executions")


def test_sidecar_killed_mid_job_answers_the_redelivery_in_doubt(tmp_path, procs):
    user = new_user()
    ledger = Ledger(tmp_path / "ledger.jsonl")
    env = {**TIMINGS, "DESKBRIDGE_RECLAIM_IDLE_S": "60"}  # the drain redelivers, not reclaim
    hub = procs.hub(tmp_path, env, name="pod")
    first = procs.add(Sidecar(tmp_path, hub.ws, issue(user), tools=["counting_tools"],
                              env={**env, **ledger.env()}, name="desk"))  # fmt: skip
    wait_online(hub.http, user)
    key = "doubt-" + user
    caller = procs.callers.post(
        hub.http, user, "record", {"key": key, "seconds": 30}, key=key, timeout_s=60
    )
    wait_until(lambda: ledger.starts(key), timeout_s=15, what="the job started")
    first.signal_group(signal.SIGKILL)  # mid-job: started, no outcome
    first.popen.wait(5)
    killed_at = time.time()
    again = procs.add(Sidecar(tmp_path, hub.ws, issue(user), tools=["counting_tools"],
                              env={**env, **ledger.env()}, name="desk",
                              data_dir=first.data_dir))  # fmt: skip
    answer = caller.result(timeout=70)
    assert answer.http_status == 409, answer.body
    assert answer.status == "in_doubt" and answer.body["error"]["code"] == "in_doubt"
    assert "may have acted" in answer.body["error"]["message"]
    assert len(ledger.starts(key)) == 1 and ledger.ends(key) == []  # never re-run
    assert "were running when the sidecar last stopped" in again.output()
    # a caller retrying the same key later gets the same answer, still without a run
    retry = post_job(hub.http, user, "record", {"key": key, "seconds": 30}, key=key, timeout_s=20)
    assert retry.status == "in_doubt", retry.body
    assert len(ledger.starts(key)) == 1
    print(f"\nkill -9 mid-job -> caller answered in_doubt {answer.at - killed_at:.2f} s later")
