"""Issue 12 item 1 on real processes: the sidecar's durable ledger.

* 400 keyed jobs (``timeout_s=300``), then Redis rewound to an earlier copy of its AOF
  (its own ``redis-server --appendonly yes``; the AOF directory copied while jobs run,
  restored after all 400 completed): the rewound stream redelivers every job that was
  not acknowledged at the copy, and none runs again. The old in-memory cache (256
  outcomes) ran the oldest of them twice (49 of 400 in the field).
* kill -9 of the sidecar mid-job, restart on the same data directory, redelivery: the
  caller is answered ``in_doubt`` (409) and the tool does not run again.

The oracle is the counting tool's own file (one line per start), not the sidecar's word.
"""

from __future__ import annotations

import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
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


def _dispatch_all(redis_url: str, user: str, keys: list[str]) -> list[str]:
    """``Bridge.dispatch`` of every key at once (``timeout_s=300``) from one trio run;
    returns the statuses in order."""
    import trio
    from deskbridge_hub import Bridge, RedisSubstrate

    async def main() -> list[str]:
        statuses = [""] * len(keys)
        substrate = RedisSubstrate.from_url(redis_url)
        async with substrate:
            bridge = Bridge(substrate)

            async def one(i: int, key: str) -> None:
                outcome = await bridge.dispatch(
                    user, "record", {"key": key}, idempotency_key=key, timeout_s=300
                )
                statuses[i] = outcome.status

            with trio.fail_after(330):
                async with trio.open_nursery() as nursery:
                    for i, key in enumerate(keys):
                        nursery.start_soon(one, i, key)
        return statuses

    return trio.run(main)


def test_redis_rewound_to_an_older_aof_runs_nothing_twice(tmp_path, procs):
    n_jobs, copy_after = 400, 100
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
    stream = f"bridge:jobs:{{{user}}}"
    with ThreadPoolExecutor(max_workers=1) as pool:
        # all 400 enqueued at once (Bridge.dispatch over Redis, concurrently): the
        # sidecar works through them one at a time, so the copy catches 300 unacked
        running = pool.submit(_dispatch_all, redis.url, user, keys)
        wait_until(
            lambda: (
                int(redis.command("XLEN", stream)) == n_jobs and len(ledger.counts()) >= copy_after
            ),
            timeout_s=120,
            what="all enqueued and 100 ran",
        )
        shutil.copytree(redis.workdir / "appendonlydir", copy)  # the "earlier copy"
        statuses = running.result(timeout=360)
    assert statuses == ["completed"] * n_jobs, [s for s in statuses if s != "completed"][:3]
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
    assert len(counts) == n_jobs
    log = sidecar.output()  # the redeliveries did reach the sidecar, and were answered
    answered = log.count("(record): ok") + log.count("(record): answered from the dedupe cache")
    assert answered >= n_jobs + unacked - 40, (answered, unacked)
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
