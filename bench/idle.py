"""N idle desktops on one hub process (issue 10's idle figures).

Starts a private ``redis-server`` (``--redis-port``, default 6412), one real hub process
(``deskbridge-hub serve --workers 1``), one extra desktop ("the extra user"), then a swarm
of N fake desktops in one asyncio process (``bench/lib/desktop.py``: the real v1 frames,
``hello`` and ``pong``, nothing else; ``ulimit -n`` raised to the hard limit for the hub
and the swarm). It measures:

  baseline     the extra user's echo p50 (``Bridge.call``) with no idle desktops, hub RSS
  ramp         time until all N are welcomed (or --ramp-s passes)
  idle window  --duration-s seconds: presence of all N sampled every --sample-s with one
               MGET (present now / min present / flaps: a key present at one sample and
               absent or naming another session at the next), hub CPU %, Redis commands/s
               (INFO commandstats, the bench's own MGET/INFO left out) per idle desktop,
               Redis connections the hub holds (its sockets, /proc) and opened (INFO),
               the swarm's sockets closed and reconnected, and why they closed (the
               close code and reason received, a pong timeout, or the exception)
  loaded echo  the extra user's echo p50 while the N are connected
  baseline     the extra user's echo p50 again once the N have left; the loaded figure
  again        is judged against the mean of the two baselines (this machine's speed
               drifts within the minutes between them)

and prints hub RSS per connection ((RSS with N - RSS before) / N) and the swarm
process's own CPU (so you can tell whether the swarm, not the hub, was the limit).

Usage: ./dev bench idle [--n 1000] [--duration-s 60] [--ramp-s 300] [--echo-calls 500]
       [--profile FILE]   (py-spy on the hub during the idle window)
       [--profile-ramp FILE]   (py-spy on the hub during the ramp: the handshake path)
       [--keep-logs DIR]   (the hub's, Redis' and the swarms' logs, kept)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.lib.desktop import raise_nofile  # noqa: E402
from bench.lib.measure import (  # noqa: E402
    RedisInfo,
    connections_to,
    cpu_s,
    group_pids,
    rss_bytes,
    start_private_redis,
)
from tests.procs import (  # noqa: E402
    BIN,
    SECRET,
    Hub,
    Proc,
    presence_key,
    wait_until,
)


def start_swarm(
    tmp: Path, ws: str, prefix: str, n: int, concurrency: int, *, own_pings: bool = True
) -> tuple[Proc, Path]:
    """N fake desktops (``bench/lib/desktop.py``) pinging as the real sidecar does."""
    status = tmp / f"swarm-{prefix}.json"
    proc = Proc(
        [
            str(BIN / "python"),
            str(ROOT / "bench" / "lib" / "desktop.py"),
            "--url",
            ws,
            "--prefix",
            prefix,
            "--count",
            str(n),
            "--secret",
            SECRET,
            "--status-file",
            str(status),
            "--connect-concurrency",
            str(concurrency),
            "--reconnect-s",
            "5",
            *(["--own-pings"] if own_pings else []),
        ],
        {"PYTHONPATH": str(ROOT)},
        tmp / f"swarm-{prefix}.log",
    )
    return proc, status


def swarm_status(status: Path) -> dict:
    try:
        return json.loads(status.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


async def echo_p50(redis_url: str, user: str, n: int) -> tuple[float, float, int]:
    from deskbridge_hub import Bridge, RedisSubstrate

    samples, errors = [], 0
    async with RedisSubstrate.from_url(redis_url) as substrate:
        bridge = Bridge(substrate)
        for i in range(10):
            with contextlib.suppress(Exception):  # warm-up: failures show in the figures
                await bridge.call(user, "echo", {"warm": i}, timeout_s=10)
        for i in range(n):
            t0 = time.perf_counter()
            try:
                await bridge.call(user, "echo", {"i": i}, timeout_s=10)
            except Exception:  # noqa: BLE001 - counted
                errors += 1
            samples.append(time.perf_counter() - t0)
    ms = sorted(s * 1000 for s in samples)
    return statistics.median(ms), ms[max(0, int(len(ms) * 0.99) - 1)], errors


class PresenceSampler(threading.Thread):
    """MGET of every swarm user's presence key every ``interval_s``, on its own raw
    connection; counts flaps per user."""

    def __init__(self, port: int, users: list[str], interval_s: float) -> None:
        super().__init__(daemon=True)
        self.info = RedisInfo(port)
        self.keys = [presence_key(u) for u in users]
        self.interval_s = interval_s
        self.samples = 0
        self.present_min = len(users)
        self.present_last = 0
        self.flaps = 0
        self.flapped_users: set[int] = set()
        self._last: list[str | None] | None = None
        self._halt = threading.Event()

    def sample(self) -> None:
        values = []
        for i in range(0, len(self.keys), 1000):
            values += self.info.command("MGET", *self.keys[i : i + 1000])
        self.samples += (len(self.keys) + 999) // 1000
        present = sum(v is not None for v in values)
        self.present_last = present
        self.present_min = min(self.present_min, present)
        if self._last is not None:
            for i, (a, b) in enumerate(zip(self._last, values, strict=True)):
                if a is not None and a != b:
                    self.flaps += 1
                    self.flapped_users.add(i)
        self._last = values

    def run(self) -> None:
        while not self._halt.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        self._halt.set()
        self.join(10)
        self.info.close()


def log_summary(text: str, top: int = 8) -> list[tuple[str, int]]:
    """The hub log's WARNING/ERROR lines, with times, ids and numbers blanked, counted."""
    import re
    from collections import Counter

    counts: Counter[str] = Counter()
    for line in text.splitlines():
        if " WARNING " not in line and " ERROR " not in line:
            continue
        line = line[24:] if line[:4].isdigit() else line
        line = re.sub(r"[0-9a-f]{16}\.[0-9a-f]{32}|[0-9a-f]{32}", "<id>", line)
        line = re.sub(r"\b[ix][0-9a-f]{4}-\d{5}\b", "<user>", line)
        line = re.sub(r"\d+(\.\d+)?", "N", line)
        counts[line[:160]] += 1
    return counts.most_common(top)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--duration-s", type=float, default=60.0)
    p.add_argument("--ramp-s", type=float, default=300.0)
    p.add_argument("--sample-s", type=float, default=1.0)
    p.add_argument("--echo-calls", type=int, default=500)
    p.add_argument("--connect-concurrency", type=int, default=64)
    p.add_argument("--redis-port", type=int, default=6412)
    p.add_argument("--json", default="")
    p.add_argument(
        "--hub-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for the hub (repeatable), e.g. DESKBRIDGE_PING_INTERVAL_S=60",
    )
    p.add_argument(
        "--keep-logs",
        default="",
        metavar="DIR",
        help="copy the hub's, Redis' and the swarms' logs to DIR before cleaning up",
    )
    p.add_argument(
        "--profile-ramp",
        default="",
        metavar="FILE",
        help="py-spy the hub during the ramp (the handshake path); summary printed",
    )
    p.add_argument(
        "--profile",
        default="",
        metavar="FILE",
        help="py-spy the hub during the idle window (samples holding the GIL: CPU, not syscall "
        "wall time); raw stacks to FILE, summary printed",
    )
    args = p.parse_known_args()[0]
    nofile = raise_nofile()
    out: dict = {"n": args.n, "nofile": nofile}
    with tempfile.TemporaryDirectory(prefix="bench-idle-") as tmp_name:
        tmp = Path(tmp_name)
        redis = start_private_redis(tmp, args.redis_port, "redis-idle")
        procs: list[Proc] = [redis]
        try:
            hub_env = dict(kv.split("=", 1) for kv in args.hub_env)
            hub = Hub(tmp, workers=1, env={"DESKBRIDGE_REDIS_URL": redis.url, **hub_env})
            procs.append(hub)
            hub.wait_healthy()
            extra_prefix = f"x{secrets.token_hex(2)}-"
            extra, extra_status = start_swarm(tmp, hub.ws, extra_prefix, 1, 1)
            procs.append(extra)
            wait_until(
                lambda: swarm_status(extra_status).get("welcomed") == 1,
                timeout_s=30,
                what="extra desktop welcomed",
            )
            extra_user = f"{extra_prefix}00000"
            p50, p99, errs = trio.run(echo_p50, redis.url, extra_user, args.echo_calls)
            out["echo_idle0"] = {"p50_ms": p50, "p99_ms": p99, "errors": errs}
            time.sleep(1.0)
            hub_pids = group_pids(hub.pid)
            out["hub_rss0_mib"] = rss_bytes(hub_pids) / 2**20
            info = RedisInfo(redis.port)
            conns_before = int(info.info("stats")["total_connections_received"])

            prefix = f"i{secrets.token_hex(2)}-"
            users = [f"{prefix}{i:05d}" for i in range(args.n)]
            swarm, status = start_swarm(tmp, hub.ws, prefix, args.n, args.connect_concurrency)
            procs.append(swarm)
            ramp_profiler = None
            if args.profile_ramp:
                from bench.lib.profile import Profiler

                ramp_profiler = Profiler(max(hub_pids), Path(args.profile_ramp))
                ramp_profiler.start()
            t0 = time.monotonic()
            ramp_end = t0 + args.ramp_s
            while time.monotonic() < ramp_end:
                st = swarm_status(status)
                if st.get("welcomed", 0) >= args.n:
                    break
                if swarm.popen.poll() is not None:
                    raise RuntimeError(f"swarm exited:\n{swarm.output()[-3000:]}")
                time.sleep(0.5)
            if ramp_profiler is not None:
                ramp_profiler.stop()
            st = swarm_status(status)
            out["ramp"] = {
                "seconds": time.monotonic() - t0,
                "welcomed": st.get("welcomed", 0),
                "failures": st.get("failures", 0),
                "failure_kinds": st.get("failure_kinds", {}),
                "closes": st.get("closes", 0),
            }
            print(
                f"# ramp: {out['ramp']['welcomed']}/{args.n} welcomed in "
                f"{out['ramp']['seconds']:.1f} s ({out['ramp']['failures']} failed attempts)",
                file=sys.stderr,
            )
            time.sleep(2.0)  # let the ramp's last handshakes settle

            sampler = PresenceSampler(redis.port, users, args.sample_s)
            sampler.sample()
            hub_pids = group_pids(hub.pid)
            snap0 = info.snapshot()
            cpu0 = cpu_s(hub_pids)
            swarm0 = swarm_status(status)
            redis_cpu0 = cpu_s([redis.pid])
            w0 = time.monotonic()
            sampler.start()
            profiler = None
            if args.profile:
                from bench.lib.profile import Profiler

                profiler = Profiler(max(hub_pids), Path(args.profile), gil=True)
                profiler.start()
            held_max = 0
            end = w0 + args.duration_s
            while time.monotonic() < end:
                held_max = max(held_max, connections_to(hub_pids, redis.port))
                time.sleep(min(2.0, max(0.0, end - time.monotonic())))
            elapsed = time.monotonic() - w0
            if profiler is not None:
                profiler.stop()
            sampler.stop()
            cpu1 = cpu_s(hub_pids)
            snap1 = info.snapshot()
            swarm1 = swarm_status(status)
            cmds = snap1.commands_since(snap0)
            cmds["mget"] = cmds.get("mget", 0) - sampler.samples
            cmds = {k: v for k, v in cmds.items() if v > 0}
            total = sum(cmds.values())
            out["idle"] = {
                "seconds": elapsed,
                "present_now": sampler.present_last,
                "present_min": sampler.present_min,
                "presence_flaps": sampler.flaps,
                "users_flapped": len(sampler.flapped_users),
                "hub_cpu_pct": 100 * (cpu1 - cpu0) / elapsed,
                "redis_cpu_pct": 100 * (cpu_s([redis.pid]) - redis_cpu0) / elapsed,
                "redis_commands_per_s": total / elapsed,
                "redis_commands_per_s_per_desktop": total / elapsed / max(1, args.n),
                "redis_commands_by_name_per_s": {
                    k: round(v / elapsed, 2) for k, v in sorted(cmds.items(), key=lambda kv: -kv[1])
                },
                "hub_redis_connections_held": connections_to(hub_pids, redis.port),
                "hub_redis_connections_held_max": held_max,
                "redis_connections_opened_per_s": (
                    snap1.connections_received - snap0.connections_received
                )
                / elapsed,
                "swarm_closes": swarm1.get("closes", 0) - swarm0.get("closes", 0),
                "swarm_welcomes": swarm1.get("welcomes", 0) - swarm0.get("welcomes", 0),
                "swarm_close_kinds": {
                    k: v - swarm0.get("close_kinds", {}).get(k, 0)
                    for k, v in swarm1.get("close_kinds", {}).items()
                    if v - swarm0.get("close_kinds", {}).get(k, 0)
                },
                "swarm_cpu_pct": 100
                * (swarm1.get("cpu_s", 0) - swarm0.get("cpu_s", 0))
                / max(1e-9, swarm1.get("t", 0) - swarm0.get("t", 0)),
                "welcomed_now": swarm1.get("welcomed", 0),
                # per desktop per minute: the swarm's own pings (answered by the hub)
                # and the hub's pings (answered by the swarm); a real sidecar is never
                # pinged by the hub once it has pinged itself
                "own_pings_per_desktop_min": (
                    swarm1.get("own_pings", 0) - swarm0.get("own_pings", 0)
                )
                / max(1, args.n)
                / elapsed
                * 60,
                "hub_pings_per_desktop_min": (swarm1.get("pings", 0) - swarm0.get("pings", 0))
                / max(1, args.n)
                / elapsed
                * 60,
                "pong_timeouts": swarm1.get("pong_timeouts", 0) - swarm0.get("pong_timeouts", 0),
            }
            out["hub_rss_mib"] = rss_bytes(hub_pids) / 2**20
            out["hub_rss_per_conn_kib"] = (
                # per socket the hub holds now (all N when every one is connected)
                (out["hub_rss_mib"] - out["hub_rss0_mib"])
                * 1024
                / max(1, out["idle"]["welcomed_now"])
            )
            out["redis_connections_opened_since_start"] = (
                int(info.info("stats")["total_connections_received"]) - conns_before
            )
            p50, p99, errs = trio.run(echo_p50, redis.url, extra_user, args.echo_calls)
            out["echo_idleN"] = {"p50_ms": p50, "p99_ms": p99, "errors": errs}
            out["swarm_cpu_s_total"] = swarm_status(status).get("cpu_s", 0)
            out["hub_log_warnings"] = log_summary(hub.output())
            info.close()
            # The baseline again with the N gone: this machine's speed drifts within the
            # minutes between the two, so the ratio is against both ends' mean.
            swarm.stop(timeout_s=30)
            procs.remove(swarm)
            time.sleep(10.0)  # the hub ends N sessions
            p50, p99, errs = trio.run(echo_p50, redis.url, extra_user, args.echo_calls)
            out["echo_idle0_after"] = {"p50_ms": p50, "p99_ms": p99, "errors": errs}
        finally:
            for proc in reversed(procs):
                proc.stop(timeout_s=10)
            if args.keep_logs:
                import shutil

                keep = Path(args.keep_logs)
                keep.mkdir(parents=True, exist_ok=True)
                for log in tmp.glob("*.log"):
                    shutil.copy(log, keep / log.name)
    if args.json:  # first, so a failing report still leaves the figures
        Path(args.json).write_text(json.dumps(out, indent=1))
    report(out, args)
    if args.profile_ramp and Path(args.profile_ramp).exists():
        from bench.lib.profile import summarise

        print("\nhub CPU profile during the ramp (py-spy):")
        print(summarise(Path(args.profile_ramp)))
    if args.profile and Path(args.profile).exists():
        from bench.lib.profile import summarise

        print("\nhub CPU profile during the idle window (py-spy):")
        print(summarise(Path(args.profile)))
    return 0


def baseline_p50(out: dict) -> float:
    """The extra user's echo p50 with no idle desktops: the mean of the runs before the
    N connected and after they left (ms)."""
    return (out["echo_idle0"]["p50_ms"] + out["echo_idle0_after"]["p50_ms"]) / 2


def report(out: dict, args: argparse.Namespace) -> None:
    idle = out["idle"]
    load = os.getloadavg()
    print(
        f"idle: {args.n} desktops on one hub process (--workers 1), {idle['seconds']:.0f} s "
        f"window; load average {load[0]:.2f}, {os.cpu_count()} CPUs, ulimit -n {out['nofile']}"
    )
    rows = [
        (
            "welcomed (ramp)",
            f"{out['ramp']['welcomed']} in {out['ramp']['seconds']:.1f} s, "
            f"{out['ramp']['failures']} failed attempts",
        ),
        ("failed attempts by kind (ramp)", f"{out['ramp']['failure_kinds'] or 'none'}"),
        ("welcomed at the end", f"{idle['welcomed_now']}"),
        ("present (presence keys) end / min", f"{idle['present_now']} / {idle['present_min']}"),
        ("presence flaps (users)", f"{idle['presence_flaps']} ({idle['users_flapped']})"),
        (
            "swarm sockets closed / re-welcomed",
            f"{idle['swarm_closes']} / {idle['swarm_welcomes']}",
        ),
        ("why they closed (code reason)", f"{idle.get('swarm_close_kinds') or 'none'}"),
        (
            "pings per desktop-minute: own / hub's",
            f"{idle.get('own_pings_per_desktop_min', 0):.2f} / "
            f"{idle.get('hub_pings_per_desktop_min', 0):.2f} "
            f"({idle.get('pong_timeouts', 0)} pong timeouts)",
        ),
        ("hub CPU % of one core", f"{idle['hub_cpu_pct']:.1f}"),
        ("hub RSS MiB before / with N", f"{out['hub_rss0_mib']:.1f} / {out['hub_rss_mib']:.1f}"),
        ("hub RSS per connection KiB", f"{out['hub_rss_per_conn_kib']:.1f}"),
        (
            "Redis conns held by hub (end/max)",
            f"{idle['hub_redis_connections_held']} / {idle['hub_redis_connections_held_max']}",
        ),
        ("Redis conns opened /s (window)", f"{idle['redis_connections_opened_per_s']:.2f}"),
        ("Redis conns opened since swarm start", f"{out['redis_connections_opened_since_start']}"),
        ("Redis commands/s (all)", f"{idle['redis_commands_per_s']:.1f}"),
        ("Redis commands/s per idle desktop", f"{idle['redis_commands_per_s_per_desktop']:.3f}"),
        ("Redis CPU %", f"{idle['redis_cpu_pct']:.2f}"),
        (
            "extra user's echo p50/p99 ms, 0 idle",
            f"{out['echo_idle0']['p50_ms']:.2f} / {out['echo_idle0']['p99_ms']:.2f}",
        ),
        (
            f"extra user's echo p50/p99 ms, {args.n} idle",
            f"{out['echo_idleN']['p50_ms']:.2f} / {out['echo_idleN']['p99_ms']:.2f} "
            f"({out['echo_idleN']['p50_ms'] / baseline_p50(out):.2f}x of the 0-idle mean; "
            f"{out['echo_idleN']['errors']} errors)",
        ),
        (
            "extra user's echo ms, 0 idle after",
            f"{out['echo_idle0_after']['p50_ms']:.2f} / {out['echo_idle0_after']['p99_ms']:.2f}",
        ),
        (
            "swarm process CPU % (window) / s total",
            f"{idle['swarm_cpu_pct']:.1f} / {out['swarm_cpu_s_total']:.1f}",
        ),
    ]
    for label, value in rows:
        print(f"  {label:<40} {value}")
    ratio = out["echo_idleN"]["p50_ms"] / baseline_p50(out)
    # per-desktop costs mean something only when every desktop is connected and present
    whole = idle["welcomed_now"] >= args.n and idle["present_min"] >= args.n
    partial = " (not all N connected and present: not judged)"
    judged = [
        (
            "all welcomed, and still at the end",
            out["ramp"]["welcomed"] >= args.n and idle["welcomed_now"] >= args.n,
            f"{out['ramp']['welcomed']} / {idle['welcomed_now']}",
        ),
        (
            "presence of every one set the whole time (0 flaps)",
            idle["presence_flaps"] == 0 and idle["present_min"] >= args.n,
            f"min {idle['present_min']}, {idle['presence_flaps']} flaps",
        ),
        (
            "hub holds <= 16 Redis connections",
            idle["hub_redis_connections_held_max"] <= 16,
            f"max {idle['hub_redis_connections_held_max']}",
        ),
        (
            "<= 0.15 Redis commands/s per idle desktop",
            whole and idle["redis_commands_per_s_per_desktop"] <= 0.15,
            f"{idle['redis_commands_per_s_per_desktop']:.3f}" + ("" if whole else partial),
        ),
        (
            "hub CPU <= 25 % of one core",
            whole and idle["hub_cpu_pct"] <= 25,
            f"{idle['hub_cpu_pct']:.1f} %" + ("" if whole else partial),
        ),
        (
            "hub RSS <= 64 KiB per connection",
            out["hub_rss_per_conn_kib"] <= 64,
            f"{out['hub_rss_per_conn_kib']:.1f} KiB",
        ),
        (
            "extra user's echo p50 within 1.5x of none idle",
            ratio <= 1.5 and out["echo_idleN"]["errors"] == 0,
            f"{ratio:.2f}x",
        ),
    ]
    print(
        f"  issue 10 targets at N={args.n} for {idle['seconds']:.0f} s "
        "(the target run is N=10,000 for 300 s):"
    )
    for label, ok, figures in judged:
        print(f"    {'MET ' if ok else 'NOT MET':<8} {label:<52} {figures}")
    if out.get("hub_log_warnings"):
        print("  hub log WARNING/ERROR lines (count, normalised):")
        for line, n in out["hub_log_warnings"]:
            print(f"    {n:6d}  {line}")
    top = ", ".join(f"{k} {v:g}" for k, v in list(idle["redis_commands_by_name_per_s"].items())[:8])
    print(f"  commands/s by name: {top or 'none'}")


if __name__ == "__main__":
    sys.exit(main())
