"""One client hammering the sidecar handshake: what does it cost another user's calls?

Starts a private ``redis-server`` (``--redis-port``, default 6417), one hub process
(``deskbridge-hub serve --workers 1`` on ``--hub-port``, default a free one) and one real
``deskbridge-sidecar`` of a probe user, then for each phase calls the probe's ``echo``
over HTTP (one keep-alive connection, back to back) for ``--seconds`` and prints its
p50 / p90 in ms, with what the phase cost: the hub's CPU (``/proc``), the Redis commands
run (INFO commandstats, less the probe's own calls measured in the quiet phase) and the
lines the hub logged. Phases:

  quiet    nobody else
  forged   ``bench/lib/handshake_flood.py`` at ``--rate`` upgrades a second with a token
           signed by another secret (403 each)
  valid    the same with a valid token of a storm user that also sends ``hello`` and
           closes after the hub's first frame: a sidecar in a crash loop, or two desktops
           of one user taking the session from each other, without backing off

Usage: ./dev bench handshake_storm [--rate 300] [--seconds 10] [--redis-port 6417]
       [--hub-port PORT]
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.lib.measure import RedisInfo, cpu_s, group_pids, start_private_redis  # noqa: E402
from tests.procs import API_KEY, Hub, Sidecar, issue, running, wait_until  # noqa: E402


def _probe(client: httpx.Client, url: str, seconds: float) -> list[float]:
    """Echo calls back to back for ``seconds``; their round trips in ms."""
    out: list[float] = []
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        t0 = time.perf_counter()
        r = client.post(url, json={"name": "echo", "args": {"i": i}, "timeout_s": 10})
        out.append((time.perf_counter() - t0) * 1000)
        assert r.status_code == 200 and r.json().get("result") == {"i": i}, r.text
        i += 1
    return out


def _phase(name, hub, redis_info, client, url, seconds, flood_argv) -> dict:
    pids = group_pids(hub.pid)
    cpu0, before = cpu_s(pids), redis_info.snapshot()
    lines0 = hub.output().count("\n")
    flood = (
        subprocess.Popen(flood_argv, stdout=subprocess.PIPE, text=True)
        if flood_argv
        else None
    )
    try:
        time.sleep(0.5 if flood else 0)  # the storm under way before the probe starts
        samples = _probe(client, url, seconds)
    finally:
        flood_out = flood.communicate(timeout=30)[0] if flood else ""
    commands = redis_info.snapshot().commands_since(before)
    ms = sorted(samples)
    return {
        "phase": name,
        "calls": len(ms),
        "p50_ms": round(statistics.median(ms), 2),
        "p90_ms": round(ms[int(len(ms) * 0.9) - 1], 2),
        "hub_cpu_s": round(cpu_s(pids) - cpu0, 2),
        "redis_commands": sum(commands.values()),
        "redis_top": dict(sorted(commands.items(), key=lambda kv: -kv[1])[:6]),
        "hub_log_lines": hub.output().count("\n") - lines0,
        "flood": json.loads(flood_out) if flood_out.strip() else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=300.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--redis-port", type=int, default=6417)
    parser.add_argument("--hub-port", type=int, default=None)
    args = parser.parse_known_args()[0]
    probe = "probe-" + secrets.token_hex(3)
    storm_user = "storm-" + secrets.token_hex(3)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        redis = start_private_redis(tmp, args.redis_port, "redis-storm")
        with running(redis):
            hub = Hub(
                tmp, workers=1, port=args.hub_port, env={"DESKBRIDGE_REDIS_URL": redis.url}
            )
            with running(hub):
                hub.wait_healthy()
                sidecar = Sidecar(tmp, hub.ws, issue(probe))
                headers = {"Authorization": f"Bearer {API_KEY}"}
                with running(sidecar), httpx.Client(headers=headers, timeout=30) as client:
                    base = f"{hub.http}/v1/users/{probe}"
                    wait_until(
                        lambda: client.get(base + "/presence").json()["online"], timeout_s=30
                    )
                    _probe(client, base + "/jobs", 1.0)  # warm-up
                    from deskbridge_hub import issue_token

                    forged = issue_token("another-secret-" + "x" * 32, storm_user)
                    flood = [
                        sys.executable,
                        str(ROOT / "bench/lib/handshake_flood.py"),
                        "--port",
                        str(hub.port),
                        "--rate",
                        str(args.rate),
                        "--seconds",
                        str(args.seconds + 0.5),
                    ]
                    info = RedisInfo(redis.port)
                    phases = [
                        ("quiet", None),
                        ("forged", [*flood, "--token", forged]),
                        ("valid", [*flood, "--token", issue(storm_user), "--hello"]),
                    ]
                    print(
                        f"handshake storm at {args.rate:g}/s vs a probe user's echo "
                        f"(1 hub worker, {args.seconds:g} s a phase)"
                    )
                    for name, argv in phases:
                        row = _phase(name, hub, info, client, base + "/jobs", args.seconds, argv)
                        print(json.dumps(row))
                    info.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
