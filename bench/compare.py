"""deskbridge next to two simple designs, in the same run, on loopback (issue 10 item 6).

Systems, each with its own fresh ``redis-server`` and the same fake desktop process
(``bench/lib/desktop.py``: real v1 frames, echo answered at once):

  deskbridge  ``deskbridge-hub serve --workers 1`` (a real hub process); calls through
              ``Bridge.call`` (and over HTTP for the sequential figure)
  pubsub      a Redis pub/sub request-reply relay (``bench/lib/pubsub_hub.py``; the way
              Socket.IO's and Django Channels' Redis adapters route): at-most-once
  streams     the same Streams + BLPOP design as deskbridge in plain asyncio with
              ``websockets`` + ``redis`` (redis-py) (``bench/lib/streams_hub.py``)
  trio        the same as ``streams``, frame for frame and command for command, on
              deskbridge's own stack: a bare ASGI app under Hypercorn's trio worker,
              coredis, trio (``bench/lib/trio_hub.py``): the floor this stack sets, so
              deskbridge / trio is deskbridge's own overhead and trio / streams the stack's

Each peer's docstring says what it does and does not guarantee. Peers are bench-only
dependencies pinned in ``bench/requirements.txt`` (``./dev bench compare`` installs them).

Per system, after a warm-up, the caller process (``bench/lib/callers.py``) measures:
  idle          Redis commands/s and hub CPU with the desktops connected and no calls
  sequential    N echo calls one after another: p50 / p99 latency
  http          (deskbridge only) the same over one keep-alive HTTP connection
  UxC           C concurrent callers over U users for --load-s seconds: jobs/s, p50/p99
and for every phase: hub CPU ms per call (``/proc/<pid>/stat`` of the hub's process
group), Redis CPU ms per call (the ``redis-server`` process's: the single thread every
replica shares, so what bounds a deployment's jobs/s), Redis commands per call
(``INFO commandstats`` deltas, the instruments' own INFO left out), Redis connections
opened (``total_connections_received`` delta) and held (by the hub: its established
sockets to Redis from ``/proc``; in all: ``connected_clients``).
Last, ``--monitor-calls`` sequential calls under MONITOR split the commands per call
into those the caller process sent, those the hub process sent and those run inside
scripts (``[lua]``), and count *steps* per sender (a command, a script, or a whole
MULTI ... EXEC block is one step; a pipeline without MULTI is invisible to MONITOR, so
steps bound round trips from above). With deskbridge measured, a bare Hypercorn trio
ASGI app (``bench/lib/bare_asgi.py``) answers the same number of sequential POSTs and
WebSocket echoes: its CPU per request is the floor under "HTTP adds", per echo the part of
the hub's CPU per call that is Hypercorn's WebSocket alone (printed beside the targets). Then the
issue-10 targets this run can judge are printed as MET / NOT MET.

Usage:
  ./dev bench compare [--calls 1000] [--load-s 5] [--users 64]
      [--systems deskbridge,pubsub,streams,trio] [--redis-port 6408] [--json out.json]
      [--profile DIR [--profile-gil]] [--rounds N]

``--rounds N`` measures every system N times, interleaved, and reports the median of each
figure: the systems run one after another, so on a machine whose speed drifts a slow
spell otherwise falls on one system's phase and skews its ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.lib.desktop import raise_nofile  # noqa: E402
from bench.lib.measure import start_private_redis  # noqa: E402
from tests.procs import (  # noqa: E402
    API_KEY,
    BIN,
    SECRET,
    Hub,
    Proc,
    free_port,
    wait_until,
)

SHAPES = [(1, 1), (1, 64), (64, 8), (64, 64)]
SYSTEMS = ("deskbridge", "pubsub", "streams", "trio")


def _python() -> str:
    return str(BIN / "python")


def start_hub(
    system: str, tmp: Path, redis_url: str, port: int | None = None
) -> tuple[Proc, str, str]:
    """Returns (process, ws URL, http URL); ``port`` None: a free one."""
    if system == "deskbridge":
        hub = Hub(tmp, workers=1, port=port, env={"DESKBRIDGE_REDIS_URL": redis_url})
        hub.wait_healthy()
        return hub, hub.ws, hub.http
    port = port or free_port()
    proc = Proc(
        [
            _python(),
            str(ROOT / "bench" / "lib" / f"{system}_hub.py"),
            "--port",
            str(port),
            "--redis-url",
            redis_url,
            "--secret",
            SECRET,
        ],
        {"PYTHONPATH": str(ROOT)},
        tmp / f"{system}-hub.log",
    )

    def up() -> bool:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{system} hub exited:\n{proc.output()[-2000:]}")
        import socket

        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True

    wait_until(up, timeout_s=20, what=f"{system} hub listening")
    return proc, f"ws://127.0.0.1:{port}", ""


def start_desktops(tmp: Path, ws: str, prefix: str, count: int) -> tuple[Proc, Path]:
    status = tmp / f"desktops-{prefix}.json"
    proc = Proc(
        [
            _python(),
            str(ROOT / "bench" / "lib" / "desktop.py"),
            "--url",
            ws,
            "--prefix",
            prefix,
            "--count",
            str(count),
            "--secret",
            SECRET,
            "--status-file",
            str(status),
        ],
        {"PYTHONPATH": str(ROOT)},
        tmp / f"desktops-{prefix}.log",
    )

    def welcomed() -> bool:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"desktops exited:\n{proc.output()[-2000:]}")
        return status.exists() and json.loads(status.read_text())["welcomed"] >= count

    wait_until(welcomed, timeout_s=60, interval_s=0.2, what=f"{count} desktops welcomed")
    return proc, status


def run_system(system: str, args: argparse.Namespace, tmp: Path, port: int) -> dict:
    redis = start_private_redis(tmp, port, f"redis-{system}")
    procs: list[Proc] = [redis]
    try:
        hub, ws, http = start_hub(system, tmp, redis.url)
        procs.append(hub)
        prefix = f"b{secrets.token_hex(2)}-"
        desktops, _ = start_desktops(tmp, ws, prefix, args.users)
        procs.append(desktops)
        users = [f"{prefix}{i:05d}" for i in range(args.users)]
        plan = {
            "users": users,
            "idle_s": args.idle_s,
            "sequential": args.calls,
            "shapes": [s for s in SHAPES if s[0] <= args.users],
            "load_s": args.load_s,
            "monitor_calls": args.monitor_calls,
        }
        out = tmp / f"result-{system}.json"
        argv = [
            _python(),
            str(ROOT / "bench" / "lib" / "callers.py"),
            "--system",
            system,
            "--redis-url",
            redis.url,
            "--redis-pid",
            str(redis.pid),
            "--hub-pgid",
            str(hub.pid),
            "--plan",
            json.dumps(plan),
            "--out",
            str(out),
        ]
        if http:
            argv += ["--hub-http", http]
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DESKBRIDGE_API_KEY": API_KEY,
            "DESKBRIDGE_TEST_REDIS_URL": redis.url,
        }
        budget = 120 + args.calls * 0.05 * 2 + args.load_s * len(SHAPES) * 3
        profiler = None
        if args.profile:
            from bench.lib.measure import group_pids
            from bench.lib.profile import Profiler

            target = max(group_pids(hub.pid))  # the serving process (the only one with -w 1)
            profiler = Profiler(
                target, Path(args.profile) / f"{system}-hub.pyspy.txt", gil=args.profile_gil
            )
            profiler.start()
        try:
            done = subprocess.run(argv, env=env, timeout=budget, capture_output=True, text=True)
        finally:
            if profiler is not None:
                profiler.stop()
        if done.returncode != 0:
            raise RuntimeError(f"{system} callers failed:\n{done.stdout}\n{done.stderr[-4000:]}")
        result = json.loads(out.read_text())
        result["desktop_cpu_s"] = json.loads((tmp / f"desktops-{prefix}.json").read_text())["cpu_s"]
        return result
    finally:
        for proc in reversed(procs):
            proc.stop(timeout_s=5)


def hypercorn_floor(tmp: Path, calls: int) -> tuple[float, float]:
    """CPU ms of a bare Hypercorn trio ASGI app (``bench/lib/bare_asgi.py``) per HTTP
    request (``calls`` sequential POSTs of a small JSON body over one keep-alive
    connection, as the HTTP phase sends them) and per WebSocket round trip (``calls``
    sequential echoes of a job-frame-sized text message: what a call's job frame out and
    result frame in cost Hypercorn alone)."""
    import httpx
    from websockets.sync.client import connect

    from bench.lib.measure import cpu_s

    port = free_port()
    proc = Proc(
        [_python(), str(ROOT / "bench" / "lib" / "bare_asgi.py"), str(port)],
        {"PYTHONPATH": str(ROOT)},
        tmp / "bare-asgi.log",
    )
    try:
        url = f"http://127.0.0.1:{port}/v1/users/u/jobs"
        body = {"name": "echo", "args": {"i": 1}, "timeout_s": 10}

        def up() -> bool:
            if proc.popen.poll() is not None:
                raise RuntimeError(f"bare ASGI app exited:\n{proc.output()[-2000:]}")
            return httpx.post(url, json=body, timeout=1).status_code == 200

        wait_until(up, timeout_s=20, what="bare ASGI app listening")
        with httpx.Client(timeout=30) as client:
            for _ in range(50):
                client.post(url, json=body)
            before = cpu_s([proc.pid])
            for _ in range(calls):
                client.post(url, json=body)
            http_ms = (cpu_s([proc.pid]) - before) / calls * 1000
        frame = json.dumps({"type": "job", "id": "0" * 32, "args": {"i": 1}, "pad": "x" * 200})
        with connect(f"ws://127.0.0.1:{port}/ws", compression=None) as ws:
            for _ in range(50):
                ws.send(frame)
                ws.recv()
            before = cpu_s([proc.pid])
            for _ in range(calls):
                ws.send(frame)
                ws.recv()
            ws_ms = (cpu_s([proc.pid]) - before) / calls * 1000
        return http_ms, ws_ms
    finally:
        proc.stop(timeout_s=5)


def median_results(runs: list[dict]) -> dict:
    """One result from ``runs`` of the same system: the median of every number found at
    the same place in each (the first run's value for anything else)."""
    first = runs[0]
    if len(runs) == 1:
        return first
    out: dict = {}
    for key, value in first.items():
        same = [run.get(key) for run in runs]
        if isinstance(value, dict) and all(isinstance(v, dict) for v in same):
            out[key] = median_results(same)
        elif (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and all(isinstance(v, int | float) for v in same)
        ):
            out[key] = statistics.median(same)
        else:
            out[key] = value
    return out


def fmt(v: float, digits: int = 2) -> str:
    if v != v:  # NaN
        return "-"
    return f"{v:.{digits}f}"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def targets(results: dict[str, dict]) -> list[tuple[str, bool | None, str]]:
    """Issue 10's "done when" lines that this run can judge: (target, met?, figures).
    None when a figure is missing (a system not run)."""
    d = results.get("deskbridge")
    if d is None:
        return []
    ps, st = results.get("pubsub"), results.get("streams")
    out: list[tuple[str, bool | None, str]] = []
    seq = d["sequential"]["p50_ms"]
    if st:
        out.append(
            (
                "seq p50 <= plain-asyncio's",
                seq <= st["sequential"]["p50_ms"],
                f"{seq:.2f} vs {st['sequential']['p50_ms']:.2f} ms",
            )
        )
    if ps:
        out.append(
            (
                "seq p50 <= 1.5x pub/sub's",
                seq <= 1.5 * ps["sequential"]["p50_ms"],
                f"{seq:.2f} vs 1.5 x {ps['sequential']['p50_ms']:.2f} ms",
            )
        )
    cpu = d["sequential"]["hub_cpu_ms_per_call"]
    ws_floor = d.get("hypercorn_ws_floor_ms")
    ws_note = f" (Hypercorn's WebSocket echo alone: {ws_floor:.3f} ms)" if ws_floor else ""
    out.append(("hub CPU per call <= 0.8 ms", cpu <= 0.8, f"{cpu:.3f} ms{ws_note}"))
    if "sequential_http" in d:
        extra = d["sequential_http"]["hub_cpu_ms_per_call"] - cpu
        floor = d.get("hypercorn_floor_ms")
        note = f" (a bare Hypercorn ASGI app alone: {floor:.3f} ms/request)" if floor else ""
        out.append(("HTTP adds <= 1 ms of hub CPU", extra <= 1.0, f"+{extra:.3f} ms{note}"))
    for u, c in SHAPES:
        k = f"load_{u}x{c}"
        if st and k in d and k in st:
            out.append(
                (
                    f"{u}x{c} jobs/s >= plain-asyncio's",
                    d[k]["jobs_per_s"] >= st[k]["jobs_per_s"],
                    f"{d[k]['jobs_per_s']:.0f} vs {st[k]['jobs_per_s']:.0f}",
                )
            )
    tr = results.get("trio")
    if tr and st:  # not a target: where the gap lies (the stack's, or deskbridge's own)
        out.append(
            (
                "(floor) the streams design on trio + Hypercorn + coredis",
                None,
                f"seq p50 {tr['sequential']['p50_ms']:.2f} ms, hub CPU "
                f"{tr['sequential']['hub_cpu_ms_per_call']:.3f} ms/call (plain asyncio: "
                f"{st['sequential']['p50_ms']:.2f} ms, "
                f"{st['sequential']['hub_cpu_ms_per_call']:.3f} ms/call)",
            )
        )
    if "load_64x64" in d:
        j = d["load_64x64"]["jobs_per_s"]
        out.append(("64x64 >= 2,000 jobs/s", j >= 2000, f"{j:.0f}"))
    held = max(d[k]["hub_redis_connections_held"] for k in d if k.startswith("load_"))
    out.append(("hub holds <= 16 Redis connections", held <= 16, f"max {held}"))
    phases = [k for k in d if k.startswith("load_") or k == "sequential"]
    opened = sum(d[k].get("hub_redis_connections_opened", 0) for k in phases)
    everyone = sum(d[k]["redis_connections_opened"] for k in phases)
    out.append(
        (
            "steady state: the hub opens no Redis connection",
            opened == 0,
            f"hub {opened} opened (all clients, the callers' process included: {everyone})",
        )
    )
    mon = d.get("monitor")
    if mon and "steps_per_call" in mon:
        caller, hub = mon["steps_per_call"]["caller"], mon["steps_per_call"]["hub"]
        # a read is a step that reads the stream: XREADGROUP, sent as is or inside the
        # holder's read script (one EVAL step; its XREADGROUP shows as [lua])
        per_call = mon["per_call"]
        reads = per_call["hub"].get("xreadgroup", 0) + per_call.get("lua", {}).get("xreadgroup", 0)
        wakes = per_call["hub"].get("blmpop", 0)
        # The background (the hub's presence heartbeats, both processes' connection
        # probes) runs through the MONITORed window too: as many commands as the idle
        # phase measured per second (no calls, the same desktops), times the window.
        idle_rate = d["idle"]["redis_commands_per_s"]
        background = idle_rate * mon.get("seconds", 0.0) / mon["calls"]
        out.append(
            (
                "Redis steps per call <= 3 (caller 2 + holder 1 besides the read)",
                # what exceeds caller 2 + holder 1 is within the background (the
                # figures are rounded to 0.01 per call)
                max(0.0, caller - 2) + max(0.0, hub - reads - 1) <= background + 0.01,
                f"caller {caller:g}, hub {hub:g} incl. {reads:g} reads (XREADGROUP: the "
                f"hub's, or the submit script's for it), {wakes:g} BLMPOP (pops the pushed "
                f"entry, or a wake-up), ~{background:.3f} background (the idle rate "
                f"{idle_rate:.2f}/s over the {mon.get('seconds', 0.0):.2f} s MONITORed)",
            )
        )
    return out


def report(results: dict[str, dict], args: argparse.Namespace) -> None:
    systems = list(results)
    base = "deskbridge" if "deskbridge" in results else systems[0]
    peers = [s for s in systems if s != base]
    head = f"{'figure':<34}" + "".join(f"{s:>12}" for s in systems)
    head += "".join(f"{base[:5] + '/' + p[:6]:>14}" for p in peers)
    print(head)
    print("-" * len(head))

    def row(label: str, get, digits: int = 2) -> None:
        vals = []
        for s in systems:
            try:
                vals.append(get(results[s]))
            except (KeyError, TypeError):
                vals.append(float("nan"))
        line = f"{label:<34}" + "".join(f"{fmt(v, digits):>12}" for v in vals)
        b = vals[systems.index(base)]
        for p in peers:
            line += f"{ratio(b, vals[systems.index(p)]):>14}"
        print(line)

    row("idle redis cmds/s", lambda r: r["idle"]["redis_commands_per_s"], 1)
    row("idle hub CPU %", lambda r: r["idle"]["hub_cpu_pct"], 1)
    for phase, label in (("sequential", "seq"), ("sequential_http", "seq HTTP")):
        row(f"{label} p50 ms", lambda r, ph=phase: r[ph]["p50_ms"])
        row(f"{label} p99 ms", lambda r, ph=phase: r[ph]["p99_ms"])
        row(f"{label} hub CPU ms/call", lambda r, ph=phase: r[ph]["hub_cpu_ms_per_call"], 3)
        row(
            f"{label} caller CPU ms/call",
            lambda r, ph=phase: r[ph].get("caller_cpu_ms_per_call", float("nan")),
            3,
        )
        row(
            f"{label} redis CPU ms/call",
            lambda r, ph=phase: r[ph].get("redis_cpu_ms_per_call", float("nan")),
            3,
        )
        row(f"{label} redis cmds/call", lambda r, ph=phase: r[ph]["redis_commands_per_call"])
        row(f"{label} redis conns opened", lambda r, ph=phase: r[ph]["redis_connections_opened"], 0)
        row(f"{label} errors", lambda r, ph=phase: r[ph]["errors"], 0)
    for u, c in SHAPES:
        k = f"load_{u}x{c}"
        row(f"{u}x{c} jobs/s", lambda r, k=k: r[k]["jobs_per_s"], 0)
        row(f"{u}x{c} p50 ms", lambda r, k=k: r[k]["p50_ms"])
        row(f"{u}x{c} p99 ms", lambda r, k=k: r[k]["p99_ms"])
        row(f"{u}x{c} hub CPU ms/call", lambda r, k=k: r[k]["hub_cpu_ms_per_call"], 3)
        row(
            f"{u}x{c} caller CPU ms/call",
            lambda r, k=k: r[k].get("caller_cpu_ms_per_call", float("nan")),
            3,
        )
        row(
            f"{u}x{c} redis CPU ms/call",
            lambda r, k=k: r[k].get("redis_cpu_ms_per_call", float("nan")),
            3,
        )
        row(f"{u}x{c} redis cmds/call", lambda r, k=k: r[k]["redis_commands_per_call"])
        row(f"{u}x{c} redis conns opened", lambda r, k=k: r[k]["redis_connections_opened"], 0)
        row(f"{u}x{c} redis conns held (hub)", lambda r, k=k: r[k]["hub_redis_connections_held"], 0)
        row(
            f"{u}x{c} redis conns held (caller)",
            lambda r, k=k: r[k]["caller_redis_connections_held"],
            0,
        )
        row(f"{u}x{c} redis conns held (all)", lambda r, k=k: r[k]["redis_connections_held"], 0)
        row(f"{u}x{c} errors", lambda r, k=k: r[k]["errors"], 0)
    print()
    print(
        "ratios: deskbridge's figure / the peer's (latency, CPU, commands: lower is better;"
        " jobs/s: higher is better)"
    )
    judged = targets(results)
    if judged:
        print("\nissue 10 targets (this run):")
        for label, ok, figures in judged:
            mark = "-" if ok is None else "MET " if ok else "NOT MET"
            print(f"  {mark:<8} {label:<64} {figures}")
    for s in systems:
        mon = results[s].get("monitor")
        if mon:
            print(
                f"\n{s}: Redis commands per call by sender "
                f"(MONITOR, {mon['calls']} sequential calls)"
            )
            for role, cmds in mon["per_call"].items():
                if cmds:
                    detail = ", ".join(f"{k} {v:g}" for k, v in cmds.items())
                    steps = mon.get("steps_per_call", {}).get(role)
                    step_text = f" in {steps:g} steps" if steps is not None else ""
                    print(f"  {role:<7} {mon['per_call_total'][role]:5.2f}{step_text}  ({detail})")
    for s in systems:
        mon = results[s].get("monitor") or {}
        if mon.get("last_call"):
            print(f"\n{s}: the last MONITORed call, ms from its first command (sender, command)")
            for ms, role, cmd in mon["last_call"][:40]:
                print(f"  {ms:9.3f}  {role:<7} {cmd}")
    print()
    for s in systems:
        for what, n in results[s].get("failures", {}).items():
            print(f"{s}: {n} x {what}")
    for s in systems:
        idle = results[s]["idle"]
        top = ", ".join(
            f"{k} {v / args.idle_s:.1f}"
            for k, v in list(idle["redis_commands_by_name"].items())[:6]
        )
        print(f"{s}: idle commands/s with {idle['users']} desktops: {top or 'none'}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--load-s", type=float, default=5.0)
    p.add_argument("--idle-s", type=float, default=3.0)
    p.add_argument("--users", type=int, default=64)
    p.add_argument("--monitor-calls", type=int, default=1000)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--redis-port", type=int, default=6408, help="first of 4 ports (one per system)")
    p.add_argument("--json", default="", help="also write every figure to this file")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure every system this many times, interleaved (d, p, s, d, p, s, ...), "
        "and report each figure's median: a slow spell of the machine then hits every "
        "system alike (default 1)",
    )
    p.add_argument(
        "--profile",
        default="",
        metavar="DIR",
        help="py-spy each hub during its run; raw stacks to DIR, summary printed",
    )
    p.add_argument(
        "--profile-gil",
        action="store_true",
        help="with --profile: only samples holding the GIL (CPU, not syscall wall time)",
    )
    args = p.parse_known_args()[0]
    raise_nofile()
    results: dict[str, dict] = {}
    failed: dict[str, str] = {}
    started = time.time()
    rounds: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp:
        for r in range(args.rounds):
            for i, system in enumerate(args.systems.split(",")):
                if system in failed:
                    continue
                t0 = time.time()
                try:
                    got = run_system(system, args, Path(tmp), args.redis_port + i)
                except Exception as exc:  # noqa: BLE001 - report it, measure the others
                    failed[system] = f"{type(exc).__name__}: {exc}"[-3000:]
                    print(f"# {system}: FAILED after {time.time() - t0:.0f} s", file=sys.stderr)
                    continue
                rounds.setdefault(system, []).append(got)
                print(
                    f"# {system}: round {r + 1} measured in {time.time() - t0:.0f} s",
                    file=sys.stderr,
                )
        results = {system: median_results(runs) for system, runs in rounds.items()}
        if "deskbridge" in results:
            try:
                http_ms, ws_ms = hypercorn_floor(Path(tmp), args.calls)
                results["deskbridge"]["hypercorn_floor_ms"] = http_ms
                results["deskbridge"]["hypercorn_ws_floor_ms"] = ws_ms
            except Exception as exc:  # noqa: BLE001 - a figure of context, not a target
                print(f"# Hypercorn floor not measured: {exc}", file=sys.stderr)
    load = os.getloadavg()
    print(
        f"compare: {args.calls} sequential calls, {args.load_s:g} s per shape, "
        f"{args.rounds} round(s) (medians), "
        f"{args.users} desktops connected; load average {load[0]:.2f} {load[1]:.2f}, "
        f"{os.cpu_count()} CPUs; {time.time() - started:.0f} s in all"
    )
    for system, why in failed.items():
        print(f"{system}: NOT MEASURED — {why}")
    if not results:
        return 1
    report(results, args)
    if args.profile:
        from bench.lib.profile import summarise

        for system in results:
            path = Path(args.profile) / f"{system}-hub.pyspy.txt"
            if path.exists():
                print()
                print(
                    f"{system} hub CPU profile (py-spy, whole caller run: warm-up and every phase)"
                )
                print(summarise(path))
    if args.json:
        Path(args.json).write_text(json.dumps({**results, "not_measured": failed}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    sys.exit(main())
