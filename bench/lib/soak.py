"""The soak's engine (issue 16 item 4): hubs behind HAProxy, sidecars behind cutting
proxies, callers retrying one idempotency key each, faults on a schedule. Used by
``bench/soak.py`` (the full run, printed) and ``tests/chaos/test_soak.py`` (the short run,
asserted).

Everything is a real process on loopback: ``redis-server`` with an append-only file,
``deskbridge-hub serve --workers 1`` pods behind a real HAProxy, real sidecar processes
with the counting tool (``tests/tools/counting_tools.py``: every execution appends a line
to a ledger file, so executions are counted by the tool itself, not by what anyone
reports). Callers are threads posting ``record`` through HAProxy's HTTP port.

Every wait is bounded: a call's HTTP request waits at most its ``timeout_s`` plus a
slack (past that the attempt counts as *hung*), a key is retried for at most
``key_budget_s``, the run stops issuing keys at its end and the drain is bounded.
"""

from __future__ import annotations

import random
import secrets
import socket
import statistics
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import attrs
import httpx

from tests.chaos._harness import CuttableProxy
from tests.procs import (
    API_KEY,
    HAProxy,
    Hub,
    Ledger,
    Proc,
    Sidecar,
    free_port,
    issue,
    kill_group,
    wait_until,
)

#: Answers a caller retries with the same idempotency key: the job may not have run or
#: its outcome is unknown (docs/outcomes.md), plus transport failures (HAProxy's own
#: 5xx when a pod dies mid-request, a refused or reset connection).
RETRY = frozenset({"offline", "unavailable", "lost", "timeout", "http-5xx", "conn-error", "hung"})
#: Final answers after which the key must not have run.
NOT_RUN = frozenset({"offline", "lost"})
#: Final answers that say the job did not run (docs/outcomes.md); ``expired`` included.
SAID_NOT_RUN = frozenset({"offline", "lost", "expired"})
#: Seconds an HTTP attempt may take beyond the job's timeout_s before it counts as hung.
HUNG_SLACK_S = 10.0


@attrs.define
class SoakConfig:
    """Knobs of one soak run (seconds unless named otherwise)."""

    hubs: int = 3
    sidecars: int = 20
    callers: int = 16
    calm_s: float = 60.0  # no faults: the reference minute(s)
    faults_s: float = 540.0
    bucket_s: float = 60.0  # throughput is counted per bucket
    kill_every_s: float = 10.0
    restart_after_s: float = 2.0
    cut_every_s: float = 5.0
    redis_restart: bool = True
    redis_down_s: float = 1.0
    appendfsync: str = "everysec"
    call_timeout_s: float = 10.0
    key_budget_s: float = 60.0
    retry_pause_s: float = 0.2
    job_s: float = 0.05  # the counting tool's sleep
    redis_port: int = 0  # 0: a free port
    hub_env: dict[str, str] = attrs.field(factory=lambda: {"DESKBRIDGE_RECLAIM_IDLE_S": "5"})
    seed: int = 0


class AofRedis(Proc):
    """``redis-server`` with an append-only file in ``workdir``: SIGKILL it and start
    another on the same port and directory, and it replays the AOF."""

    def __init__(self, tmp: Path, port: int, appendfsync: str, name: str = "redis") -> None:
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"
        workdir = tmp / "redis-aof"
        workdir.mkdir(exist_ok=True)
        argv = [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            appendfsync,
            "--dir",
            str(workdir),
        ]
        super().__init__(argv, {}, tmp / f"{name}-{port}-{time.time():.0f}.log")

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        from tests.procs import resp_command

        def ok() -> bool:
            if self.popen.poll() is not None:
                raise RuntimeError(f"redis-server exited {self.popen.returncode}")
            return resp_command("127.0.0.1", self.port, "PING", timeout_s=1.0) == "PONG"

        wait_until(ok, timeout_s=timeout_s, what=f"redis-server on {self.port}")


@attrs.define
class KeyRecord:
    key: str
    user: str
    started: float
    ended: float = 0.0
    attempts: list[tuple[str, float, float]] = attrs.field(factory=list)  # (status, t0, t1)
    final: str = ""
    gave_up: bool = False


class Soak:
    """One soak run. ``run()`` returns the report (a dict); ``procs`` are stopped at the
    end of ``run()`` whatever happens."""

    def __init__(self, tmp: Path, config: SoakConfig, log=print) -> None:
        self.tmp = tmp
        self.cfg = config
        self.log = log
        self.rng = random.Random(config.seed or None)
        self.run_id = secrets.token_hex(3)
        self.ledger = Ledger(tmp / "ledger.jsonl")
        self.procs: list[Proc] = []
        self.hubs: list[Hub] = []
        self.hub_ports: list[int] = []
        self.proxies: list[CuttableProxy] = []
        self.keys: list[KeyRecord] = []
        self._keys_lock = threading.Lock()
        self.faults: Counter[str] = Counter()
        self.fault_log: list[tuple[float, str]] = []
        self._stop_new = threading.Event()
        self._stop_faults = threading.Event()
        self._hub_lock = threading.Lock()
        self.t0 = 0.0
        self.redis: AofRedis | None = None

    # -- set-up -------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        assert self.redis is not None
        return {"DESKBRIDGE_REDIS_URL": self.redis.url, **self.cfg.hub_env}

    def _start_hub(self, slot: int, *, wait: bool) -> Hub:
        hub = Hub(
            self.tmp, workers=1, port=self.hub_ports[slot], env=self._env(), name=f"pod{slot}"
        )
        self.procs.append(hub)
        if wait:
            hub.wait_healthy(timeout_s=30)
        return hub

    def start(self) -> None:
        cfg = self.cfg
        port = cfg.redis_port or free_port()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                raise RuntimeError(f"port {port} is already in use (another Redis?)")
        except OSError:
            pass
        self.redis = AofRedis(self.tmp, port, cfg.appendfsync)
        self.procs.append(self.redis)
        self.redis.wait_ready()
        self.hub_ports = [free_port() for _ in range(cfg.hubs)]
        self.hubs = [self._start_hub(i, wait=True) for i in range(cfg.hubs)]
        self.lb = HAProxy(self.tmp, self.hub_ports)
        self.procs.append(self.lb)
        self.lb.wait_ready()
        self.users = [f"soak{self.run_id}-{i:02d}" for i in range(cfg.sidecars)]
        for user in self.users:
            proxy = CuttableProxy(self.lb.port)
            self.proxies.append(proxy)
            self.procs.append(
                Sidecar(
                    self.tmp,
                    proxy.ws,
                    issue(user, lifetime_s=24 * 3600),
                    tools=["counting_tools"],
                    env=self.ledger.env(),
                    name=f"sidecar-{user}",
                )
            )
        client = httpx.Client(headers={"Authorization": f"Bearer {API_KEY}"}, timeout=5)
        with client:
            for user in self.users:
                wait_until(
                    lambda u=user: client.get(f"{self.lb.http}/v1/users/{u}/presence").json()[
                        "online"
                    ],
                    timeout_s=60,
                    interval_s=0.2,
                    what=f"{user} online",
                )

    # -- callers ------------------------------------------------------------------------

    def _attempt(self, client: httpx.Client, user: str, key: str) -> str:
        body = {
            "name": "record",
            "args": {"key": key, "seconds": self.cfg.job_s},
            "idempotency_key": key,
            "timeout_s": self.cfg.call_timeout_s,
        }
        try:
            r = client.post(f"{self.lb.http}/v1/users/{user}/jobs", json=body)
        except httpx.TimeoutException:
            return "hung"
        except httpx.TransportError:
            return "conn-error"
        try:
            status = r.json().get("status")
        except ValueError:
            status = None
        if not status:
            return "http-5xx" if r.status_code >= 500 else f"http-{r.status_code}"
        return str(status)

    def _caller(self, idx: int) -> None:
        client = httpx.Client(
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=self.cfg.call_timeout_s + HUNG_SLACK_S,
        )
        n = 0
        with client:
            while not self._stop_new.is_set():
                user = self.users[(idx + n * self.cfg.callers) % len(self.users)]
                key = f"k{self.run_id}-{idx:02d}-{n:05d}"
                n += 1
                rec = KeyRecord(key=key, user=user, started=time.time())
                with self._keys_lock:
                    self.keys.append(rec)
                while True:
                    a0 = time.time()
                    status = self._attempt(client, user, key)
                    rec.attempts.append((status, a0, time.time()))
                    if status not in RETRY:
                        break
                    if time.time() - rec.started > self.cfg.key_budget_s:
                        rec.gave_up = True
                        break
                    time.sleep(self.cfg.retry_pause_s)
                rec.final = status
                rec.ended = time.time()

    # -- faults -------------------------------------------------------------------------

    def _fault(self, what: str) -> None:
        self.faults[what] += 1
        self.fault_log.append((time.time() - self.t0, what))

    def _kill_hub(self, slot: int) -> None:
        with self._hub_lock:
            kill_group(self.hubs[slot])
        self._fault("hub kill -9")

    def _restart_hub(self, slot: int) -> None:
        with self._hub_lock:
            self.hubs[slot] = self._start_hub(slot, wait=False)
        self._fault("hub restart")

    def _faults(self) -> None:
        cfg = self.cfg
        start = time.time()
        next_kill = start + cfg.kill_every_s
        next_cut = start + cfg.cut_every_s
        redis_at = start + cfg.faults_s / 2 if cfg.redis_restart else float("inf")
        restarts: list[tuple[float, int]] = []
        slot = 0
        while not self._stop_faults.is_set():
            now = time.time()
            for when, s in list(restarts):
                if now >= when:
                    restarts.remove((when, s))
                    self._restart_hub(s)
            if now >= next_kill:
                next_kill += cfg.kill_every_s
                down = {s for _, s in restarts}
                if slot not in down:
                    self._kill_hub(slot)
                    restarts.append((now + cfg.restart_after_s, slot))
                slot = (slot + 1) % cfg.hubs
            if now >= next_cut:
                next_cut += cfg.cut_every_s
                proxy = self.rng.choice(self.proxies)
                if proxy.cut_client_side():
                    self._fault("socket cut (half-open)")
            if now >= redis_at:
                redis_at = float("inf")
                self._restart_redis()
            self._stop_faults.wait(0.05)
        for _, s in restarts:  # leave every pod running for the drain
            self._restart_hub(s)

    def _restart_redis(self) -> None:
        assert self.redis is not None
        kill_group(self.redis)
        self._fault("redis kill -9")
        time.sleep(self.cfg.redis_down_s)
        self.redis = AofRedis(self.tmp, self.redis.port, self.cfg.appendfsync, name="redis-again")
        self.procs.append(self.redis)
        self.redis.wait_ready()
        self._fault("redis restart on AOF")

    # -- the run ------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        try:
            self.start()
            self.t0 = time.time()
            callers = [
                threading.Thread(target=self._caller, args=(i,), daemon=True, name=f"caller{i}")
                for i in range(cfg.callers)
            ]
            for t in callers:
                t.start()
            self.log(
                f"# soak {self.run_id}: {cfg.hubs} hubs, {cfg.sidecars} sidecars, "
                f"{cfg.callers} callers; {cfg.calm_s:g} s calm, then {cfg.faults_s:g} s of faults"
            )
            time.sleep(cfg.calm_s)
            faults = threading.Thread(target=self._faults, daemon=True, name="faults")
            faults.start()
            time.sleep(cfg.faults_s)
            self._stop_new.set()
            end_issue = time.time()
            self._stop_faults.set()
            faults.join(30)
            bound = cfg.key_budget_s + cfg.call_timeout_s + HUNG_SLACK_S + 5
            for t in callers:
                t.join(max(0.0, end_issue + bound - time.time()))
            stuck = sum(t.is_alive() for t in callers)
            # late executions: a job queued before the end may still start within its
            # deadline; wait for them before counting
            time.sleep(cfg.call_timeout_s + 2)
            return self.report(stuck, end_issue)
        finally:
            self._stop_new.set()
            self._stop_faults.set()
            # sidecars first, proxies last: a proxy's accept thread blocked in accept()
            # still takes a reconnecting sidecar's connection after close()
            for proc in reversed(self.procs):
                try:
                    proc.stop(timeout_s=5)
                except Exception as exc:  # noqa: BLE001 - stop the rest regardless
                    self.log(f"stopping {proc.argv[0]} failed: {exc!r}")
            for proxy in self.proxies:
                proxy.close()

    def report(self, stuck_callers: int, end_issue: float) -> dict[str, Any]:
        cfg = self.cfg
        counts = self.ledger.counts()
        with self._keys_lock:
            keys = list(self.keys)
        finished = [k for k in keys if k.final]
        attempts = Counter(a[0] for k in keys for a in k.attempts)
        finals = Counter(k.final + (" (gave up)" if k.gave_up else "") for k in finished)
        execs = Counter(min(counts.get(k.key, 0), 2) for k in keys)
        doubles = [k.key for k in keys if counts.get(k.key, 0) >= 2]
        ran_but_told_not = [
            (k.key, k.final) for k in finished if k.final in NOT_RUN and counts.get(k.key, 0) >= 1
        ]
        # docs/outcomes.md: offline, lost and expired all say "it did not run"
        said_not_run = [
            {
                "key": k.key,
                "final": k.final,
                "executions": counts.get(k.key, 0),
                "attempts": [a[0] for a in k.attempts],
            }
            for k in finished
            if k.final in SAID_NOT_RUN and counts.get(k.key, 0) >= 1
        ]
        completed_not_run = [
            k.key for k in finished if k.final == "completed" and counts.get(k.key, 0) == 0
        ]
        hung_attempts = attempts.get("hung", 0)
        e2e = sorted(k.ended - k.started for k in finished if k.final == "completed")
        per_attempt = sorted(a[2] - a[1] for k in keys for a in k.attempts)
        buckets: Counter[int] = Counter()
        for k in finished:
            if k.final == "completed":
                buckets[int((k.ended - self.t0) // cfg.bucket_s)] += 1
        n_buckets = int((end_issue - self.t0) // cfg.bucket_s)
        calm_buckets = int(cfg.calm_s // cfg.bucket_s)
        per_bucket = [buckets.get(i, 0) for i in range(n_buckets)]
        calm_ref = max(per_bucket[:calm_buckets]) if calm_buckets and per_bucket else 0

        def pct(values: list[float], q: float) -> float:
            return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")

        return {
            "run_id": self.run_id,
            "config": attrs.asdict(cfg),
            "keys_issued": len(keys),
            "keys_answered": len(finished),
            "keys_completed": finals.get("completed", 0),
            "stuck_callers": stuck_callers,
            "hung_attempts": hung_attempts,
            "attempts": sum(attempts.values()),
            "attempt_histogram": dict(attempts.most_common()),
            "final_histogram": dict(finals.most_common()),
            "executions_per_key": {
                "0": execs.get(0, 0),
                "1": execs.get(1, 0),
                "2+": execs.get(2, 0),
            },
            "double_executions": doubles,
            "final_offline_or_lost_but_ran": ran_but_told_not,
            "completed_but_not_run": completed_not_run,
            "final_said_not_run_but_ran": said_not_run,
            "throughput_per_bucket": per_bucket,
            "calm_buckets": calm_buckets,
            "calm_reference": calm_ref,
            "worst_fault_bucket_ratio": (
                min(per_bucket[calm_buckets:]) / calm_ref
                if calm_ref and per_bucket[calm_buckets:]
                else float("nan")
            ),
            "key_latency_s": {
                "p50": statistics.median(e2e) if e2e else float("nan"),
                "p99": pct(e2e, 0.99),
                "max": e2e[-1] if e2e else float("nan"),
            },
            "attempt_latency_s": {
                "p50": statistics.median(per_attempt) if per_attempt else float("nan"),
                "p99": pct(per_attempt, 0.99),
                "max": per_attempt[-1] if per_attempt else float("nan"),
            },
            "faults": dict(self.faults),
        }


def format_report(r: dict[str, Any]) -> str:
    cfg = r["config"]
    lines = [
        f"soak {r['run_id']}: {cfg['hubs']} hubs behind HAProxy, {cfg['sidecars']} sidecars "
        f"behind cutting proxies, {cfg['callers']} callers; {cfg['calm_s']:g} s calm + "
        f"{cfg['faults_s']:g} s of faults (kill -9 a hub every {cfg['kill_every_s']:g} s, "
        f"restart {cfg['restart_after_s']:g} s later; cut a socket every {cfg['cut_every_s']:g} s; "
        f"Redis kill -9 + AOF restart midway: {cfg['redis_restart']}); hub env {cfg['hub_env']}",
        f"  keys issued / answered / completed   {r['keys_issued']} / {r['keys_answered']} / "
        f"{r['keys_completed']}",
        f"  hung attempts / stuck callers        {r['hung_attempts']} / {r['stuck_callers']}",
        f"  attempts by answer                   {r['attempt_histogram']}",
        f"  final answer per key                 {r['final_histogram']}",
        f"  executions per key (0/1/2+)          {r['executions_per_key']['0']} / "
        f"{r['executions_per_key']['1']} / {r['executions_per_key']['2+']}",
        f"  double executions                    {len(r['double_executions'])} "
        f"{r['double_executions'][:5]}",
        f"  final offline/lost but ran           {len(r['final_offline_or_lost_but_ran'])} "
        f"{r['final_offline_or_lost_but_ran'][:5]}",
        f"  completed but not run                {len(r['completed_but_not_run'])}",
        f"  final offline/lost/expired but ran   {len(r.get('final_said_not_run_but_ran', []))} "
        f"{r.get('final_said_not_run_but_ran', [])[:3]}",
        f"  completed per {cfg['bucket_s']:g} s (first {r['calm_buckets']} calm) "
        f"{r['throughput_per_bucket']}",
        f"  worst faulted bucket / calm          {r['worst_fault_bucket_ratio']:.2f}",
        "  key latency (first attempt -> final completed) p50/p99/max s  "
        + " / ".join(f"{r['key_latency_s'][q]:.2f}" for q in ("p50", "p99", "max")),
        "  attempt latency p50/p99/max s        "
        + " / ".join(f"{r['attempt_latency_s'][q]:.2f}" for q in ("p50", "p99", "max")),
        f"  faults performed                     {r['faults']}",
    ]
    ratio = r["worst_fault_bucket_ratio"]
    judged = [
        ("0 double executions", not r["double_executions"], f"{len(r['double_executions'])}"),
        (
            "0 hung callers",
            not r["hung_attempts"] and not r["stuck_callers"],
            f"{r['hung_attempts']} hung attempts, {r['stuck_callers']} stuck",
        ),
        (
            "0 keys finally offline/lost that ran",
            not r["final_offline_or_lost_but_ran"],
            f"{len(r['final_offline_or_lost_but_ran'])}",
        ),
        (
            "0 keys finally offline/lost/expired that ran",
            not r.get("final_said_not_run_but_ran"),
            f"{len(r.get('final_said_not_run_but_ran', []))}",
        ),
        (
            "every faulted bucket >= 70 % of the calm one",
            ratio == ratio and ratio >= 0.7,
            f"{ratio:.2f}",
        ),
        (
            "caller p99 <= 5 s (first attempt -> completed)",
            r["key_latency_s"]["p99"] <= 5.0,
            f"{r['key_latency_s']['p99']:.2f} s",
        ),
    ]
    lines.append("  issue 16 targets (this run):")
    for label, ok, figures in judged:
        lines.append(f"    {'MET ' if ok else 'NOT MET':<8} {label:<48} {figures}")
    return "\n".join(lines)
