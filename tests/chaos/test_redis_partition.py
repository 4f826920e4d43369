"""One hub process partitioned from Redis (its connections black-holed: no FIN, no RST),
while another hub process, the callers and Redis are fine.

Two pods behind HAProxy (``balance first``: the sidecar lands on pod A while it is up),
pod A reaching Redis through ``RedisPartitionProxy`` (``tests/chaos/_partition.py``),
pod B directly; callers use pod B. The counting tool's ledger is the oracle for "executed
at most once" (exactly once when completed); every caller must get a terminal answer.
"""

from __future__ import annotations

import time
from concurrent.futures import Future

import httpx
import pytest

from tests.chaos._harness import (
    TIMINGS,
    Answer,
    headers,
    new_user,
    post_job,
    presence,
    wait_online,
)
from tests.chaos._partition import RedisPartitionProxy
from tests.procs import REDIS_URL, HAProxy, Ledger, Sidecar, holder, issue, log_times, wait_until

pytestmark = pytest.mark.chaos

#: The cut-off bound with the suite's presence TTL (3 s): ``CUT_OFF_MIN_S``.
CUT_OFF_S = 10.0
TERMINAL = {
    "completed", "failed", "expired", "timeout", "offline", "unavailable", "lost",
    "cancelled", "declined", "in_doubt",
}  # fmt: skip


def _redis_port() -> int:
    from urllib.parse import urlsplit

    return urlsplit(REDIS_URL).port or 6379


def _two_pods(tmp_path, procs, env, *, ports=None):
    """Pod A through the proxy, pod B direct, HAProxy (first) in front, a sidecar with
    the counting tool through HAProxy, holding its socket on pod A."""
    proxy = RedisPartitionProxy(_redis_port())
    try:
        a = procs.hub(tmp_path, {**env, "DESKBRIDGE_REDIS_URL": proxy.url()}, name="podA")
        b = procs.hub(tmp_path, env, name="podB")
        lb = procs.add(HAProxy(tmp_path, [a.port, b.port], balance="first"))
        lb.wait_ready()
        user = new_user()
        ledger = Ledger(tmp_path / "ledger.jsonl")
        sidecar = procs.add(
            Sidecar(
                tmp_path, lb.ws, issue(user), tools=["counting_tools"], env={**env, **ledger.env()}
            )
        )
        sid = wait_online(b.http, user)
        assert holder([a], user, sid) is a, "the sidecar must start on pod A"
    except BaseException:
        proxy.close()  # its sockets left to the GC failed later tests (ResourceWarning)
        raise
    return proxy, a, b, user, ledger, sidecar, sid


def _check_answers(answers: dict[str, Future[Answer]], ledger: Ledger, timeout_s: float) -> dict:
    """Every caller got a terminal answer; no job ran twice; a completed one ran once."""
    got = {key: f.result(timeout=timeout_s) for key, f in answers.items()}
    counts = ledger.counts()
    for key, answer in got.items():
        assert answer.status in TERMINAL, (key, answer)
        assert counts.get(key, 0) <= 1, (key, ledger.events())
        if answer.status == "completed":
            assert counts.get(key, 0) == 1, (key, answer, ledger.events())
        if answer.status in ("offline", "expired", "lost"):
            assert counts.get(key, 0) == 0, (key, answer, ledger.events())
    return got


def test_a_hub_partitioned_from_redis_hands_its_desktop_to_a_healthy_replica(tmp_path, procs):
    env = dict(TIMINGS)
    proxy, a, b, user, ledger, sidecar, sid = _two_pods(tmp_path, procs, env)
    try:
        answers: dict[str, Future[Answer]] = {}
        # a job running on the desktop when the partition starts
        answers["long"] = procs.callers.post(
            b.http, user, "record", {"key": "long", "seconds": 2}, key="long", timeout_s=40
        )
        wait_until(lambda: ledger.starts("long"), timeout_s=10, what="the job started")
        cut_at = time.time()
        proxy.blackhole()
        # callers keep calling through the healthy pod during the partition
        i = 0
        moved_at = None
        while time.time() - cut_at < CUT_OFF_S + 10:
            key = f"p{i}"
            answers[key] = procs.callers.post(
                b.http, user, "record", {"key": key}, key=key, timeout_s=5
            )
            i += 1
            if moved_at is None:
                code, body = presence(b.http, user)
                if body.get("online") and body["session_id"] != sid:
                    moved_at = time.time()
            time.sleep(1.0)
        assert moved_at is not None, sidecar.output()[-3000:]
        new_sid = wait_online(b.http, user)
        assert holder([b], user, new_sid) is b
        log = sidecar.output()
        closes = [t for t in log_times(log, "code 1013") if t >= cut_at]
        assert closes, log[-3000:]
        # bound: cut-off (10 s) + one liveness check (1 s) + the close and a reconnect
        assert closes[0] - cut_at < CUT_OFF_S + 2.5, closes[0] - cut_at
        assert moved_at - cut_at < CUT_OFF_S + 5.0, moved_at - cut_at
        # a call after the move completes, through the healthy pod
        after = post_job(b.http, user, "record", {"key": "moved"}, key="moved", timeout_s=10)
        assert after.status == "completed", after.body

        proxy.heal()
        healed_at = time.time()
        # the partitioned pod recovers: ready again, and serves a desktop of its own
        wait_until(
            lambda: httpx.get(a.http + "/healthz", timeout=2).status_code == 200,
            timeout_s=15, what="pod A ready after the heal",
        )  # fmt: skip
        other = new_user()
        procs.add(Sidecar(tmp_path, a.ws, issue(other), env=env, name="direct"))
        wait_online(b.http, other, timeout_s=15)
        echo = post_job(b.http, other, "echo", {"x": 1}, timeout_s=10)
        assert echo.status == "completed", echo.body
        ready_s = time.time() - healed_at

        got = _check_answers(answers, ledger, timeout_s=60)
        assert got["long"].status == "completed", got["long"].body  # taken over by pod B
        for key, answer in got.items():  # pushed to pod A as it was cut off: never run
            if answer.status == "timeout":
                assert ledger.counts().get(key, 0) == 0, (key, ledger.events())
        assert ledger.counts()["long"] == 1
        assert "reaches Redis again" in a.output()
        by_status: dict[str, int] = {}
        for answer in got.values():
            by_status[answer.status] = by_status.get(answer.status, 0) + 1
        print(
            f"\npartition: sidecar told 1013 after {closes[0] - cut_at:.2f} s, online on pod B "
            f"after {moved_at - cut_at:.2f} s; long job answered {got['long'].status} "
            f"{got['long'].at - cut_at:.2f} s after the cut; callers during the partition: "
            f"{by_status}; pod A serving again {ready_s:.2f} s after the heal"
        )
    finally:
        proxy.close()


def _black_hole_the_wake_up_read(tmp_path, procs):
    """Two pods with the production heartbeat (30 s: the wake-up BLMPOP's block was the
    heartbeat); then only pod A's wake-up connection is black-holed, its other
    connections work."""
    env = {**TIMINGS, "DESKBRIDGE_HEARTBEAT_S": "30", "DESKBRIDGE_PRESENCE_TTL_S": "90"}
    proxy, a, b, user, ledger, sidecar, sid = _two_pods(tmp_path, procs, env)
    wait_until(proxy.blocking, timeout_s=10, what="pod A's wake-up BLMPOP")
    time.sleep(1.0)  # the BLMPOP in place, inside its block
    assert proxy.blackhole(only_blocking=True) >= 1
    return proxy, b, user, ledger, sid, time.time()


def test_a_black_holed_wake_up_read_delays_pushed_jobs_by_seconds_not_a_heartbeat(tmp_path, procs):
    """Before: the BLMPOP blocked for the heartbeat (30 s) and was given up 5 s after
    that, so every job pushed to pod A waited up to 35 s (a 25 s call timed out)."""
    proxy, b, user, ledger, sid, cut_at = _black_hole_the_wake_up_read(tmp_path, procs)
    try:
        answer = procs.callers.post(
            b.http, user, "record", {"key": "j1"}, key="j1", timeout_s=25
        ).result(timeout=40)
        assert answer.status == "completed", answer.body
        delay_s = answer.at - cut_at
        # the black-holed wait is given up after its block (2 s) + the command timeout
        # (5 s); the next wait, on a new connection, pops the job
        assert delay_s < 10.0, delay_s
        assert ledger.counts() == {"j1": 1}, ledger.events()
        code, body = presence(b.http, user)  # no session moved: the rest works
        assert body["online"] and body["session_id"] == sid
        print(f"\nwake-up connection black-holed: a pushed job completed {delay_s:.2f} s later")
    finally:
        proxy.heal()
        proxy.close()


def test_a_job_pushed_into_a_black_holed_wake_up_read_never_starts_after_its_deadline(
    tmp_path, procs
):
    """The job is pushed to pod A while its wake-up wait is black-holed (popped into the
    hole, or waiting in the list): it is served after the wait is given up, by the drain
    that follows, marked again on the server's clock, so it reaches the desktop with no
    time left and is answered ``expired``, never run after its caller was told
    ``timeout`` (counting its deadline from a later pop would hand it a fresh budget)."""
    proxy, b, user, ledger, sid, cut_at = _black_hole_the_wake_up_read(tmp_path, procs)
    try:
        answer = procs.callers.post(
            b.http, user, "record", {"key": "short"}, key="short", timeout_s=3
        ).result(timeout=20)
        assert answer.status == "timeout", answer.body
        job_id = answer.body["job_id"]

        def settled():
            with httpx.Client(headers=headers(), timeout=5) as client:
                body = client.get(f"{b.http}/v1/jobs/{job_id}").json()
            return body if "expired" in str(body) else None

        state = wait_until(settled, timeout_s=20, what="the job answered expired")
        assert ledger.counts().get("short", 0) == 0, (ledger.events(), state)
        print(f"\nwake-up connection black-holed: the 3 s job ended {state} without running")
    finally:
        proxy.heal()
        proxy.close()


@pytest.mark.parametrize("late_s", [4.0, 10.0])
def test_a_hub_that_redis_answers_late_hands_its_desktop_to_a_healthy_replica(
    tmp_path, procs, late_s
):
    """Redis answers pod A ``late_s`` late (requests arrive at once). 10 s: past the
    command timeout, like a partition except that writes land. 4 s: every command
    works, late; the liveness refresh (every second after the last reply) lands every
    5 s, so the 3 s key lapsed 2 s in every 5: callers read the desktop offline 40 % of
    the time, for as long as the slow path lasted, and it never moved."""
    proxy, a, b, user, ledger, sidecar, sid = _two_pods(tmp_path, procs, dict(TIMINGS))
    try:
        proxy.delay(late_s)
        cut_at = time.time()

        def moved():
            _, body = presence(b.http, user)
            return body.get("online") and body["session_id"] != sid

        wait_until(moved, timeout_s=CUT_OFF_S + 2 * late_s + 10, what="the desktop on pod B")
        moved_s = time.time() - cut_at
        # the cut-off (10 s) from the first refresh that found the key lapsed (sent at
        # most a reply's lateness + 1 s after the delay began) + the reconnect
        assert moved_s < CUT_OFF_S + late_s + 5.0, moved_s
        new_sid = wait_online(b.http, user)
        assert holder([b], user, new_sid) is b
        answer = post_job(b.http, user, "record", {"key": "k"}, key="k", timeout_s=10)
        assert answer.status == "completed", answer.body
        assert ledger.counts() == {"k": 1}, ledger.events()
        print(f"\nreplies {late_s:g} s late: the desktop moved to pod B after {moved_s:.2f} s")
    finally:
        proxy.heal()
        proxy.close()
