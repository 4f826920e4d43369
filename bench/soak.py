"""Soak under churn (issue 16 item 4): are jobs answered, once, while pods, sockets and
Redis die?

On loopback: ``redis-server`` with an append-only file, N ``deskbridge-hub serve
--workers 1`` pods behind a real HAProxy, one sidecar per user (counting tool) dialling
HAProxy through its own TCP proxy that can cut the connection half-open, and callers
(threads) posting ``record`` through HAProxy, each retrying its key's idempotency key on
offline / unavailable / lost / timeout / a provisional in_doubt (``detail.pending``) /
HAProxy 5xx / refused connection until another answer or ``--key-budget-s``. After
``--calm-s`` seconds without faults: a pod SIGKILLed every ``--kill-every-s`` and
restarted ``--restart-after-s`` later on the same port, a sidecar's connection cut every
``--cut-every-s``, Redis SIGKILLed and restarted on its AOF halfway through the faults.
Hubs run with ``DESKBRIDGE_RECLAIM_IDLE_S=5``.

Prints jobs issued and answered, hung attempts and stuck callers, the answer histograms
(per attempt and final per key), executions per key (0 / 1 / 2+, counted by the tool in
its ledger file), keys whose final answer was offline/lost although they ran, completed
jobs per bucket next to the calm bucket(s), caller latency p50/p99/max, faults
performed, and a timeline per 5 s (completed keys and retried attempts next to the
faults of each step). Exit status 1 if any key ran twice, any caller hung or any key that ran was
finally answered offline/lost/expired.

Usage: ./dev bench soak [--calm-s 60] [--faults-s 540] [--hubs 3] [--sidecars 20]
       [--callers 16] [--redis-port 6413] [--json FILE] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.lib.soak import Soak, SoakConfig, format_report  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    d = SoakConfig()
    for name in ("hubs", "sidecars", "callers"):
        p.add_argument(f"--{name}", type=int, default=getattr(d, name))
    for name in (
        "warmup_s",
        "calm_s",
        "faults_s",
        "bucket_s",
        "kill_every_s",
        "restart_after_s",
        "cut_every_s",
        "redis_down_s",
        "call_timeout_s",
        "key_budget_s",
        "job_s",
    ):
        p.add_argument("--" + name.replace("_", "-"), type=float, default=getattr(d, name))
    p.add_argument("--no-redis-restart", action="store_true")
    p.add_argument("--appendfsync", default=d.appendfsync)
    p.add_argument("--redis-port", type=int, default=0, help="default: a free port")
    p.add_argument(
        "--hub-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra hub environment (repeatable); RECLAIM_IDLE_S=5 is set",
    )
    p.add_argument("--json", default="")
    p.add_argument(
        "--workdir", default="", help="keep the processes' logs here (default: a temp dir)"
    )
    args = p.parse_known_args()[0]
    hub_env = dict(d.hub_env)
    for item in args.hub_env:
        k, _, v = item.partition("=")
        hub_env[k] = v
    cfg = SoakConfig(
        hubs=args.hubs,
        sidecars=args.sidecars,
        callers=args.callers,
        warmup_s=args.warmup_s,
        calm_s=args.calm_s,
        faults_s=args.faults_s,
        bucket_s=args.bucket_s,
        kill_every_s=args.kill_every_s,
        restart_after_s=args.restart_after_s,
        cut_every_s=args.cut_every_s,
        redis_restart=not args.no_redis_restart,
        redis_down_s=args.redis_down_s,
        appendfsync=args.appendfsync,
        call_timeout_s=args.call_timeout_s,
        key_budget_s=args.key_budget_s,
        job_s=args.job_s,
        redis_port=args.redis_port,
        hub_env=hub_env,
    )
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
        report = Soak(Path(args.workdir), cfg, log=lambda m: print(m, file=sys.stderr)).run()
    else:
        with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
            report = Soak(Path(tmp), cfg, log=lambda m: print(m, file=sys.stderr)).run()
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    bad = (
        report["double_executions"]
        or report["hung_attempts"]
        or report["stuck_callers"]
        or report["final_offline_or_lost_but_ran"]
        or report["final_said_not_run_but_ran"]
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
