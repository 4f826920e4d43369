"""One hub process driven past its capacity, then left alone: does it degrade gracefully
and recover by itself (no metastable failure)?

Starts a private ``redis-server`` (``--redis-port``, default 6416), one hub process
(``deskbridge-hub serve --workers 1``), ``--idle`` fake desktops nobody calls and
``--busy`` fake desktops the callers call (``bench/lib/desktop.py``: the real frames,
pinging as the real sidecar does), ``--sidecars`` real ``deskbridge-sidecar`` processes
(also called), then:

  baseline   ``--baseline-s`` seconds: a probe calls the first real sidecar's echo over
             HTTP every 0.5 s (its latency is the "normal" of the recovery figure)
  load       ``--callers`` concurrent HTTP callers (``bench/lib/http_flood.py``, raw
             keep-alive sockets, one process) for ``--load-s`` seconds, spread over the
             busy desktops and the real sidecars, ``timeout_s`` ``--timeout-s``
  recovery   up to ``--recovery-s`` seconds after the load stops

and prints, per phase: presence flaps of the idle, busy and real desktops (one MGET of
every presence key a second: a key present at one sample and absent or naming another
session at the next), the swarm's sockets closed and re-welcomed (and why), the real
sidecars' reconnects (their "connecting" log lines), the callers' answers by HTTP code
and status (a ``timeout`` by stage), any ``offline`` answer (every called desktop stays
connected, so each one is false), the hub's event-loop lag (``/metrics``:
``deskbridge_event_loop_lag_seconds``, the mean per scrape and the share of probes late
by more than 1 s and by more than 5 s) and how long ``/metrics`` took to answer, the
probe's answers, and how long after the load stopped the probe's calls were normal again
(five in a row within 3x the baseline p50 and at most 250 ms).

Then, for every caller's answer, how late it came against the asked ``timeout_s`` (in
time, T + 0.5 s, T + 1 s, ... , refusals apart, no answer within T + 20 s) and where its
time went (the hub's ``elapsed_ms``, its dispatch, against the rest).

Usage: ./dev bench overload [--idle 3000] [--busy 100] [--sidecars 3] [--callers 1000]
       [--load-s 60] [--timeout-s 10] [--recovery-s 60] [--hub-env NAME=VALUE ...]
       [--redis-port 6416] [--hub-port P] [--keep-logs DIR]
The swarm raises its own ``ulimit -n`` to the hard limit: give the shell a hard limit above
the desktops (``ulimit -Hn``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.idle import PresenceSampler, start_swarm, swarm_status  # noqa: E402
from bench.lib.desktop import raise_nofile  # noqa: E402
from bench.lib.measure import cpu_s, group_pids, start_private_redis  # noqa: E402
from tests.procs import API_KEY, BIN, Hub, Proc, Sidecar, issue, wait_until  # noqa: E402

#: A probe call is "normal" again within this many times the baseline p50 ...
NORMAL_FACTOR = 3.0
#: ... and under this (ms), however fast the baseline was.
NORMAL_FLOOR_MS = 250.0
NORMAL_RUN = 5


class Probe(threading.Thread):
    """An echo of ``user`` over HTTP every ``interval_s`` (timeout_s 5), on its own
    connection: ``(t, ms, kind)`` per call."""

    def __init__(self, hub: Hub, user: str, interval_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.url = f"{hub.http}/v1/users/{user}/jobs"
        self.interval_s = interval_s
        self.samples: list[tuple[float, float, str]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30) as c:
            while not self._halt.is_set():
                t0 = time.monotonic()
                try:
                    r = c.post(self.url, json={"name": "echo", "args": {}, "timeout_s": 5})
                    body = r.json()
                    kind = f"HTTP {r.status_code} {body.get('status')}"
                    if body.get("status") == "timeout":
                        kind += f" stage={(body.get('detail') or {}).get('stage')}"
                except (httpx.HTTPError, ValueError) as exc:
                    kind = f"conn:{type(exc).__name__}"
                self.samples.append((t0, (time.monotonic() - t0) * 1000, kind))
                self._halt.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))

    def stop(self) -> None:
        self._halt.set()
        self.join(40)


class LagScraper(threading.Thread):
    """``/metrics`` every ``interval_s``: the loop-lag histogram's count, sum and buckets
    (cumulative) at each scrape, and how long the scrape took."""

    LINE = re.compile(
        r'^deskbridge_event_loop_lag_seconds_(count|sum|bucket)(?:\{le="([^"]+)"\})? (\S+)$'
    )

    def __init__(self, hub: Hub, interval_s: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.url = f"{hub.http}/metrics"
        self.interval_s = interval_s
        self.scrapes: list[dict] = []
        self._halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30) as c:
            while not self._halt.is_set():
                t0 = time.monotonic()
                row: dict = {"t": t0}
                try:
                    text = c.get(self.url).text
                    for line in text.splitlines():
                        m = self.LINE.match(line)
                        if m:
                            what, le, value = m.groups()
                            row[f"le{le}" if what == "bucket" else what] = float(value)
                except httpx.HTTPError as exc:
                    row["error"] = type(exc).__name__
                row["scrape_ms"] = (time.monotonic() - t0) * 1000
                self.scrapes.append(row)
                self._halt.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))

    def stop(self) -> None:
        self._halt.set()
        self.join(40)

    def window(self, t0: float, t1: float) -> dict:
        """Lag figures over the scrapes taken in [t0, t1] (deltas of the histogram)."""
        rows = [r for r in self.scrapes if t0 <= r["t"] <= t1 and "count" in r]
        scrape_ms = [r["scrape_ms"] for r in self.scrapes if t0 <= r["t"] <= t1]
        out = {
            "scrapes": len(scrape_ms),
            "scrape_ms_max": max(scrape_ms, default=float("nan")),
            "scrape_errors": sum("error" in r for r in self.scrapes if t0 <= r["t"] <= t1),
        }
        if len(rows) < 2:
            return out
        a, b = rows[0], rows[-1]
        n = b["count"] - a["count"]
        late = {le: n - (b[f"le{le}"] - a[f"le{le}"]) for le in ("1.0", "5.0")}
        means = [
            (y["sum"] - x["sum"]) / (y["count"] - x["count"])
            for x, y in zip(rows, rows[1:], strict=False)
            if y["count"] > x["count"]
        ]
        out.update(
            probes=n,
            mean_s=(b["sum"] - a["sum"]) / n if n else float("nan"),
            worst_scrape_mean_s=max(means, default=float("nan")),
            late_over_1s=late["1.0"],
            late_over_5s=late["5.0"],
        )
        return out


class HealthProbe(threading.Thread):
    """``GET /livez`` and ``GET /healthz`` every ``interval_s`` on a new connection each,
    with Kubernetes' probe timeout of the manifests (``deploy/k8s``: 2 s): ``(t, path,
    ms, ok)`` per probe (ok: 200 within the timeout)."""

    def __init__(self, hub: Hub, interval_s: float = 1.0, timeout_s: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.base = hub.http
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.samples: list[tuple[float, str, float, bool]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            t0 = time.monotonic()
            for path in ("/livez", "/healthz"):
                t = time.monotonic()
                try:
                    ok = httpx.get(self.base + path, timeout=self.timeout_s).status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.samples.append((t, path, (time.monotonic() - t) * 1000, ok))
            self._halt.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))

    def stop(self) -> None:
        self._halt.set()
        self.join(20)

    def window(self, t0: float, t1: float) -> dict:
        out = {}
        for path in ("/livez", "/healthz"):
            rows = [(ms, ok) for t, p, ms, ok in self.samples if p == path and t0 <= t < t1]
            worst_run = run = 0
            for _, ok in rows:
                run = 0 if ok else run + 1
                worst_run = max(worst_run, run)
            out[path] = (
                f"{sum(not ok for _, ok in rows)} of {len(rows)} failed (worst run "
                f"{worst_run}), max {max((ms for ms, _ in rows), default=float('nan')):.0f} ms"
            )
        return out


def reconnects(sidecars: list[Sidecar]) -> int:
    """Connect attempts of the real sidecars past their first."""
    return sum(max(0, s.output().count("connecting to ") - 1) for s in sidecars)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--idle", type=int, default=3000)
    p.add_argument("--busy", type=int, default=100)
    p.add_argument("--sidecars", type=int, default=3)
    p.add_argument("--callers", type=int, default=1000)
    p.add_argument("--load-s", type=float, default=60.0)
    p.add_argument("--timeout-s", type=float, default=10.0)
    p.add_argument("--baseline-s", type=float, default=10.0)
    p.add_argument("--recovery-s", type=float, default=60.0)
    p.add_argument("--redis-port", type=int, default=6416)
    p.add_argument("--hub-port", type=int, default=0, help="default: a free port")
    p.add_argument("--hub-env", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--keep-logs", default="", metavar="DIR")
    p.add_argument("--json", default="")
    args = p.parse_known_args()[0]
    nofile = raise_nofile()
    out: dict = {"args": vars(args), "nofile": nofile}
    with tempfile.TemporaryDirectory(prefix="bench-overload-") as tmp_name:
        tmp = Path(tmp_name)
        redis = start_private_redis(tmp, args.redis_port, "redis-overload")
        procs: list[Proc] = [redis]
        try:
            hub = start_hub(tmp, redis.url, args.hub_port, args.hub_env, procs)
            real = [f"real-{i}" for i in range(args.sidecars)]
            sidecars = [Sidecar(tmp, hub.ws, issue(u, 24 * 3600), name=u) for u in real]
            procs += sidecars
            idle, idle_status = start_swarm(tmp, hub.ws, "idle-", args.idle, 64)
            busy, busy_status = start_swarm(tmp, hub.ws, "busy-", args.busy, 64)
            procs += [idle, busy]
            idle_users = [f"idle-{i:05d}" for i in range(args.idle)]
            busy_users = [f"busy-{i:05d}" for i in range(args.busy)]
            t_ramp = time.monotonic()
            wait_until(
                lambda: (
                    swarm_status(idle_status).get("welcomed", 0) >= args.idle
                    and swarm_status(busy_status).get("welcomed", 0) >= args.busy
                ),
                timeout_s=600,
                interval_s=0.5,
                what="every fake desktop welcomed",
            )
            samplers = {
                "idle": PresenceSampler(redis.port, idle_users, 1.0),
                "busy": PresenceSampler(redis.port, busy_users, 1.0),
                "real": PresenceSampler(redis.port, real, 1.0),
            }
            wait_until(
                lambda: all(
                    (s.sample() or True) and s.present_last == len(s.keys)
                    for s in samplers.values()
                ),
                timeout_s=120,
                interval_s=0.5,
                what="every desktop present",
            )
            out["ramp_s"] = time.monotonic() - t_ramp
            print(
                f"# {args.idle} + {args.busy} + {args.sidecars} desktops present "
                f"after {out['ramp_s']:.1f} s",
                file=sys.stderr,
            )
            time.sleep(2.0)
            probe, scraper, health = Probe(hub, real[0]), LagScraper(hub), HealthProbe(hub)
            for s in samplers.values():
                s.sample()
                s.start()
            probe.start()
            scraper.start()
            health.start()
            marks: dict[str, dict] = {}

            def mark(phase: str) -> None:
                marks[phase] = {
                    "t": time.monotonic(),
                    "idle": swarm_status(idle_status),
                    "busy": swarm_status(busy_status),
                    "real_reconnects": reconnects(sidecars),
                    "flaps": {
                        k: (s.flaps, len(s.flapped_users), s.present_min)
                        for k, s in samplers.items()
                    },
                    "hub_cpu_s": cpu_s(group_pids(hub.pid)),
                }
                for s in samplers.values():
                    s.present_min = len(s.keys)

            mark("baseline")
            time.sleep(args.baseline_s)
            mark("load")
            flood_out = tmp / "flood.json"
            flood = Proc(
                [
                    str(BIN / "python"),
                    str(ROOT / "bench" / "lib" / "http_flood.py"),
                    "--port",
                    str(hub.port),
                    "--key",
                    API_KEY,
                    "--users",
                    ",".join(busy_users + real),
                    "--callers",
                    str(args.callers),
                    "--seconds",
                    str(args.load_s),
                    "--timeout-s",
                    str(args.timeout_s),
                    "--out",
                    str(flood_out),
                ],
                {},
                tmp / "flood.log",
            )
            procs.append(flood)
            flood.popen.wait(args.load_s + args.timeout_s + 60)
            mark("recovery")
            t_stop = time.monotonic()
            normal_at = None
            while time.monotonic() < t_stop + args.recovery_s:
                time.sleep(1.0)
                normal_at = recovered_at(probe.samples, t_stop, baseline_ms(probe, marks))
                if normal_at is not None and time.monotonic() > normal_at + 15:
                    break
            mark("end")
            probe.stop()
            scraper.stop()
            health.stop()
            for s in samplers.values():
                s.stop()
            out["flood"] = (
                json.loads(flood_out.read_text())
                if flood_out.exists()
                else {"error": flood.output()[-2000:]}
            )
            out["phases"] = summarise(marks, probe, scraper, health)
            out["recovered_after_s"] = None if normal_at is None else normal_at - t_stop
            out["hub_log"] = log_lines(hub.output())
        finally:
            for proc in reversed(procs):
                proc.stop(timeout_s=10)
            if args.keep_logs:
                import shutil

                keep = Path(args.keep_logs)
                keep.mkdir(parents=True, exist_ok=True)
                for log in tmp.glob("*.log"):
                    shutil.copy(log, keep / log.name)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    report(out, args)
    return 0


def start_hub(tmp: Path, redis_url: str, port: int, hub_env: list[str], procs: list) -> Hub:
    """One ``serve --workers 1`` on ``redis_url`` (``port`` 0: a free one) with the
    ``NAME=VALUE`` pairs of ``hub_env``, appended to ``procs``, once healthy."""
    env = dict(kv.split("=", 1) for kv in hub_env)
    hub = Hub(tmp, workers=1, port=port or None, env={"DESKBRIDGE_REDIS_URL": redis_url, **env})
    procs.append(hub)
    hub.wait_healthy()
    return hub


def baseline_ms(probe: Probe, marks: dict[str, dict]) -> float:
    t0, t1 = marks["baseline"]["t"], marks["load"]["t"]
    ms = [m for t, m, k in probe.samples if t0 <= t < t1 and "completed" in k]
    return statistics.median(ms) if ms else NORMAL_FLOOR_MS


def recovered_at(samples: list[tuple[float, float, str]], t_stop: float, base_ms: float):
    """When the first of ``NORMAL_RUN`` normal probe calls in a row after ``t_stop``
    began, or None."""
    run: list[float] = []
    bound = max(base_ms * NORMAL_FACTOR, NORMAL_FLOOR_MS)
    for t, ms, kind in list(samples):
        if t < t_stop:
            continue
        if "completed" in kind and ms <= bound:
            run.append(t)
            if len(run) >= NORMAL_RUN:
                return run[0]
        else:
            run = []
    return None


def summarise(
    marks: dict[str, dict], probe: Probe, scraper: LagScraper, health: HealthProbe
) -> dict:
    phases = {}
    names = ["baseline", "load", "recovery", "end"]
    for a, b in zip(names, names[1:], strict=False):
        x, y = marks[a], marks[b]
        t0, t1 = x["t"], y["t"]
        kinds: dict[str, int] = {}
        ms = []
        for t, m, k in probe.samples:
            if t0 <= t < t1:
                kinds[k] = kinds.get(k, 0) + 1
                ms.append(m)
        ms.sort()
        row = {
            "seconds": t1 - t0,
            "hub_cpu_pct": 100 * (y["hub_cpu_s"] - x["hub_cpu_s"]) / (t1 - t0),
            "real_reconnects": y["real_reconnects"] - x["real_reconnects"],
            "probe": kinds,
            "probe_p50_ms": ms[len(ms) // 2] if ms else float("nan"),
            "probe_max_ms": ms[-1] if ms else float("nan"),
            "lag": scraper.window(t0, t1),
            "health": health.window(t0, t1),
        }
        for swarm in ("idle", "busy"):
            sx, sy = x[swarm], y[swarm]
            row[f"{swarm}_closes"] = sy.get("closes", 0) - sx.get("closes", 0)
            row[f"{swarm}_welcomes"] = sy.get("welcomes", 0) - sx.get("welcomes", 0)
            row[f"{swarm}_pong_timeouts"] = sy.get("pong_timeouts", 0) - sx.get("pong_timeouts", 0)
            row[f"{swarm}_close_kinds"] = {
                k: v - sx.get("close_kinds", {}).get(k, 0)
                for k, v in sy.get("close_kinds", {}).items()
                if v - sx.get("close_kinds", {}).get(k, 0)
            }
        for who, (flaps, users, _) in y["flaps"].items():
            before = x["flaps"][who]
            # the min present during the phase is what the sampler saw since the mark
            row[f"{who}_presence_flaps"] = (
                f"{flaps - before[0]} (users {users - before[1]}), min present {y['flaps'][who][2]}"
            )
        phases[a] = row
    return phases


def log_lines(text: str, top: int = 10) -> list[tuple[str, int]]:
    from bench.idle import log_summary

    return log_summary(text, top)


def report(out: dict, args) -> None:
    load = os.getloadavg()
    print(
        f"overload: {args.idle} idle + {args.busy} busy fake desktops + {args.sidecars} real "
        f"sidecars on one hub process; {args.callers} HTTP callers for {args.load_s:g} s "
        f"(timeout_s {args.timeout_s:g}); load average {load[0]:.2f}, {os.cpu_count()} CPUs"
    )
    for phase, row in out.get("phases", {}).items():
        print(f"  {phase} ({row['seconds']:.0f} s):")
        for k, v in row.items():
            if k != "seconds":
                print(f"    {k:<24} {v}")
    flood = out.get("flood", {})
    print("  callers' answers (count, p50 / p99 / max ms):")
    for kind, n in flood.get("kinds", {}).items():
        lat = flood["latency_ms"][kind]
        print(f"    {n:8d}  {kind:<44} {lat['p50']:.0f} / {lat['p99']:.0f} / {lat['max']:.0f}")
    if "error" in flood:
        print(f"    flood failed: {flood['error']}")
    offline = flood.get("offline_users", {})
    print(
        f"  'offline' answers for connected desktops: {sum(offline.values())}"
        f" (users {len(offline)})"
    )
    for line, n in flood.get("retry_after", {}).items():
        print(f"    {n:8d}  {line}")
    print(f"  answers against the asked timeout_s (T = {args.timeout_s:g} s):")
    for band, n in flood.get("vs_timeout", {}).items():
        print(f"    {n:8d}  {band}")
    for split, title in (("split_ms", "all answers"), ("late_split_ms", "answers after T+1 s")):
        parts = flood.get(split, {})
        n = next(iter(parts.values()), {}).get("n", 0)
        print(f"  where the time went, {title} ({n}), ms p50 / p99 / max:")
        for what, lat in parts.items():
            print(f"    {what:<14} {lat['p50']:.0f} / {lat['p99']:.0f} / {lat['max']:.0f}")
    rec = out.get("recovered_after_s")
    print(
        "  probe calls normal again after the load stopped: "
        + ("never within the recovery window" if rec is None else f"{rec:.1f} s")
    )
    if out.get("hub_log"):
        print("  hub log WARNING/ERROR lines (count, normalised):")
        for line, n in out["hub_log"]:
            print(f"    {n:6d}  {line}")


if __name__ == "__main__":
    sys.exit(main())
