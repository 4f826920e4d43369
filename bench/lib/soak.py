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

import os
import random
import secrets
import socket
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import attrs
import httpx

from bench.lib.soak_report import KeyRecord, build_report, format_report
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
#: its outcome is unknown (docs/outcomes.md), a provisional ``in_doubt`` (``detail.pending``:
#: the job's real outcome is still to come), plus transport failures (HAProxy's own 5xx
#: when a pod dies mid-request, a refused or reset connection).
RETRY = frozenset(
    {
        "offline",
        "unavailable",
        "lost",
        "timeout",
        "in_doubt-pending",
        "http-5xx",
        "conn-error",
        "hung",
    }
)
#: Seconds an HTTP attempt may take beyond the job's timeout_s before it counts as hung.
HUNG_SLACK_S = 10.0


@attrs.define
class SoakConfig:
    """Knobs of one soak run (seconds unless named otherwise)."""

    hubs: int = 3
    sidecars: int = 20
    callers: int = 16
    warmup_s: float = 5.0  # callers run, nothing is counted in the figures (first calls)
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


#: How often the machine's load is sampled, seconds.
MACHINE_SAMPLE_S = 5.0


def _cpu_times() -> tuple[float, float] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat, or None where there is none."""
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


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
        self._stop_sampling = threading.Event()
        self.machine: list[tuple[float, float, float | None]] = []  # (t, load 1 min, busy)
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

    def _attempt(self, client: httpx.Client, user: str, key: str, rec: KeyRecord) -> str:
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
            body = r.json()
            status = body.get("status")
            if status == "in_doubt" and (body.get("detail") or {}).get("pending"):
                status = "in_doubt-pending"
            if body.get("job_id") and body["job_id"] not in rec.job_ids:
                rec.job_ids.append(body["job_id"])
        except (ValueError, AttributeError):
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
                    status = self._attempt(client, user, key, rec)
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

    def _fault(self, what: str, mark: str) -> None:
        """Count ``what`` and log it with its timeline ``mark`` (``K1``: pod 1 killed)."""
        self.faults[what] += 1
        self.fault_log.append((time.time() - self.t0, mark))

    def _kill_hub(self, slot: int) -> None:
        with self._hub_lock:
            kill_group(self.hubs[slot])
        self._fault("hub kill -9", f"K{slot}")

    def _restart_hub(self, slot: int) -> None:
        with self._hub_lock:
            self.hubs[slot] = self._start_hub(slot, wait=False)
        self._fault("hub restart", f"R{slot}")

    def _sample_machine(self) -> None:
        """Every ``MACHINE_SAMPLE_S``: the 1-minute load average and the share of the
        machine's CPU time that was busy since the last sample (/proc/stat), so each
        bucket's throughput can be read next to how loaded the shared machine was."""
        last = _cpu_times()
        while not self._stop_sampling.wait(MACHINE_SAMPLE_S):
            now = _cpu_times()
            busy = None
            if last is not None and now is not None and now[1] > last[1]:
                busy = (now[0] - last[0]) / (now[1] - last[1])
            last = now
            self.machine.append((time.time(), os.getloadavg()[0], busy))

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
                    self._fault("socket cut (half-open)", "C")
            if now >= redis_at:
                redis_at = float("inf")
                self._restart_redis()
            self._stop_faults.wait(0.05)
        for _, s in restarts:  # leave every pod running for the drain
            self._restart_hub(s)

    def _restart_redis(self) -> None:
        assert self.redis is not None
        kill_group(self.redis)
        self._fault("redis kill -9", "X")
        time.sleep(self.cfg.redis_down_s)
        self.redis = AofRedis(self.tmp, self.redis.port, self.cfg.appendfsync, name="redis-again")
        self.procs.append(self.redis)
        self.redis.wait_ready()
        self._fault("redis restart on AOF", "U")

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
                f"{cfg.callers} callers; {cfg.warmup_s:g} s warm-up, {cfg.calm_s:g} s calm, "
                f"then {cfg.faults_s:g} s of faults"
            )
            # The first calls of each user and process (catalogue, consumer group, holder
            # check) are slower: keep them out of the calm reference.
            time.sleep(cfg.warmup_s)
            self.t0 = time.time()
            sampler = threading.Thread(target=self._sample_machine, daemon=True, name="load")
            sampler.start()
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
            self._stop_sampling.set()
            return self.report(stuck, end_issue)
        finally:
            self._stop_new.set()
            self._stop_faults.set()
            self._stop_sampling.set()
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
        with self._keys_lock:
            keys = list(self.keys)
        return build_report(
            run_id=self.run_id,
            cfg=self.cfg,
            keys=keys,
            events=self.ledger.events(),
            faults=dict(self.faults),
            fault_log=list(self.fault_log),
            t0=self.t0,
            machine=list(self.machine),
            stuck_callers=stuck_callers,
            end_issue=end_issue,
        )


__all__ = ["KeyRecord", "Soak", "SoakConfig", "format_report"]
