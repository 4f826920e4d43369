"""The soak's report (issue 16 item 4): what ``bench/lib/soak.py`` measured, as a dict,
and its printed form with issue 16's targets. No processes here: the engine hands over
its key records, the counting tool's ledger events and the faults it performed.

Besides the correctness counts, the report says where the callers' time went (to find
what eats throughput under faults): for each phase (calm, faulted), the caller-seconds
spent before the tool started (waiting on a dead holder, a stale presence, a reclaim),
running it, after it ended (an answer lost with a socket, a redelivery, a slow poll), and
on keys that never ran; and the time spent in attempts per answer.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

import attrs

#: Final answers after which the key must not have run.
NOT_RUN = frozenset({"offline", "lost"})
#: Final answers that say the job did not run (docs/outcomes.md); ``expired`` included.
SAID_NOT_RUN = frozenset({"offline", "lost", "expired"})
#: A key whose tool started (or whose answer came) later than this after the call (after
#: the tool's end) counts as a slow start (slow answer), seconds.
SLOW_S = 1.0
#: Slow keys listed (with their attempts and job ids) in the JSON report.
SLOW_KEYS_KEPT = 100
#: The timeline's step, seconds: completed keys per step next to the faults in it.
TIMELINE_S = 5.0
#: Timeline marks: what each letter of a step's faults means.
TIMELINE_MARKS = "K<n> pod n killed, R<n> pod n restarted, C socket cut, X Redis killed, U Redis up"


@attrs.define
class KeyRecord:
    key: str
    user: str
    started: float
    ended: float = 0.0
    attempts: list[tuple[str, float, float]] = attrs.field(factory=list)  # (status, t0, t1)
    final: str = ""
    gave_up: bool = False
    job_ids: list[str] = attrs.field(factory=list)  # as the answers named them


def build_report(
    *,
    run_id: str,
    cfg: Any,
    keys: list[KeyRecord],
    events: list[dict[str, Any]],
    faults: dict[str, int],
    t0: float,
    stuck_callers: int,
    end_issue: float,
    machine: list[tuple[float, float, float | None]] | None = None,
    fault_log: list[tuple[float, str]] | None = None,
) -> dict[str, Any]:
    """The report of one run (see the module docstring); ``cfg`` is the ``SoakConfig``;
    ``fault_log`` is ``[(seconds after t0, timeline mark)]`` (``TIMELINE_MARKS``)."""
    counts = Counter(e["key"] for e in events if e["event"] == "start")
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
            buckets[int((k.ended - t0) // cfg.bucket_s)] += 1
    n_buckets = int((end_issue - t0) // cfg.bucket_s)
    calm_buckets = int(cfg.calm_s // cfg.bucket_s)
    per_bucket = [buckets.get(i, 0) for i in range(n_buckets)]
    calm_ref = max(per_bucket[:calm_buckets]) if calm_buckets and per_bucket else 0

    def pct(values: list[float], q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")

    return {
        "run_id": run_id,
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
        "faults": faults,
        "timeline": timeline(finished, fault_log or [], t0, end_issue - t0),
        "machine_per_bucket": _machine_per_bucket(machine or [], t0, cfg.bucket_s, len(per_bucket)),
        "time_calm": where_time_went(
            [k for k in keys if t0 <= k.started < t0 + cfg.calm_s], events
        ),
        "time_faulted": where_time_went([k for k in keys if k.started >= t0 + cfg.calm_s], events),
    }


def timeline(
    finished: list[KeyRecord], fault_log: list[tuple[float, str]], t0: float, span_s: float
) -> list[dict[str, Any]]:
    """Per ``TIMELINE_S`` step from ``t0``: ``{"t": start s, "completed": keys completed
    in it, "retried": attempts answered with a retried answer that ended in it, "faults":
    "K0C" (the marks of the faults in it)}`` -- where the slow windows are, next to what
    was done to the system then."""
    n = max(0, int(span_s // TIMELINE_S))
    steps: list[dict[str, Any]] = [
        {"t": round(i * TIMELINE_S), "completed": 0, "retried": 0, "faults": ""} for i in range(n)
    ]

    def step(t: float) -> dict[str, Any] | None:
        i = int((t - t0) // TIMELINE_S)
        return steps[i] if 0 <= i < n else None

    for k in finished:
        if k.final == "completed" and (s := step(k.ended)) is not None:
            s["completed"] += 1
        for _, _, a1 in k.attempts[:-1]:
            if (s := step(a1)) is not None:
                s["retried"] += 1
    for t, mark in fault_log:
        if (s := step(t0 + t)) is not None:
            s["faults"] += mark
    return steps


def format_timeline(steps: list[dict[str, Any]], per_line: int = 12) -> list[str]:
    """The timeline, one minute a line: ``completed[retried]marks`` per step."""
    lines = []
    for i in range(0, len(steps), per_line):
        cells = [
            f"{s['completed']}" + (f"[{s['retried']}]" if s["retried"] else "") + s["faults"]
            for s in steps[i : i + per_line]
        ]
        lines.append(f"    {steps[i]['t']:>4} s  " + " ".join(f"{c:<9}" for c in cells).rstrip())
    return lines


def _machine_per_bucket(
    samples: list[tuple[float, float, float | None]], t0: float, bucket_s: float, n: int
) -> list[dict[str, float | None]]:
    """Mean 1-minute load average and busy CPU share per bucket (None: no sample)."""
    out: list[dict[str, float | None]] = []
    for i in range(n):
        inside = [s for s in samples if t0 + i * bucket_s <= s[0] < t0 + (i + 1) * bucket_s]
        busy = [b for _, _, b in inside if b is not None]
        out.append(
            {
                "load": round(statistics.mean(x for _, x, _ in inside), 1) if inside else None,
                "busy": round(statistics.mean(busy), 2) if busy else None,
            }
        )
    return out


def where_time_went(keys: list[KeyRecord], events: list[dict[str, Any]]) -> dict[str, Any]:
    """Caller-seconds of the answered ``keys``, split by what the caller waited for.

    Returns:
        ``{"keys", "total_s", "before_start_s", "running_s", "after_end_s", "never_ran_s",
        "slow_start", "slow_answer", "attempt_s": {answer: seconds}, "pauses_s",
        "slow_keys": [...]}``: a key
        that ran is split at its tool's first start and last end (the counting tool's
        ledger); ``slow_start`` / ``slow_answer`` count keys over ``SLOW_S``.
    """
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for e in events:
        if e["event"] == "start":
            first[e["key"]] = min(first.get(e["key"], e["t"]), e["t"])
        elif e["event"] == "end":
            last[e["key"]] = max(last.get(e["key"], e["t"]), e["t"])
    out: dict[str, Any] = {
        "keys": 0,
        "total_s": 0.0,
        "before_start_s": 0.0,
        "running_s": 0.0,
        "after_end_s": 0.0,
        "never_ran_s": 0.0,
        "slow_start": 0,
        "slow_answer": 0,
        "pauses_s": 0.0,
    }
    slow: list[dict[str, Any]] = []
    attempt_s: Counter[str] = Counter()
    for k in keys:
        if not k.final:
            continue
        out["keys"] += 1
        out["total_s"] += k.ended - k.started
        for status, a0, a1 in k.attempts:
            attempt_s[status] += a1 - a0
        out["pauses_s"] += (k.ended - k.started) - sum(a1 - a0 for _, a0, a1 in k.attempts)
        if k.key not in first:
            out["never_ran_s"] += k.ended - k.started
            continue
        start, end = first[k.key], last.get(k.key, first[k.key])
        wait_start = max(0.0, start - k.started)
        wait_answer = max(0.0, k.ended - end)
        out["before_start_s"] += wait_start
        out["running_s"] += max(0.0, end - start)
        out["after_end_s"] += wait_answer
        out["slow_start"] += wait_start > SLOW_S
        out["slow_answer"] += wait_answer > SLOW_S
        if wait_start > SLOW_S or wait_answer > SLOW_S:
            slow.append(
                {
                    "key": k.key,
                    "user": k.user,
                    "at": round(k.started, 3),
                    "start_wait_s": round(wait_start, 2),
                    "answer_wait_s": round(wait_answer, 2),
                    "attempts": [
                        (a[0], round(a[1] - k.started, 2), round(a[2] - a[1], 2))
                        for a in k.attempts
                    ],
                    "job_ids": k.job_ids,
                }
            )
    out["attempt_s"] = {s: round(v, 1) for s, v in attempt_s.most_common()}
    rounded = {n: round(v, 1) if isinstance(v, float) else v for n, v in out.items()}
    # the slowest, for the JSON report (the printed one leaves them out)
    rounded["slow_keys"] = sorted(slow, key=lambda d: -(d["start_wait_s"] + d["answer_wait_s"]))[
        :SLOW_KEYS_KEPT
    ]
    return rounded


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
    machine = r.get("machine_per_bucket") or []
    if any(m["load"] is not None for m in machine):
        lines.append(
            "  machine per bucket (load 1 min / busy CPU share)  "
            + "  ".join(
                f"{m['load']}/{m['busy']}" if m["load"] is not None else "-" for m in machine
            )
        )
    if r.get("timeline"):
        lines.append(
            f"  timeline: completed[retried attempts] per {TIMELINE_S:g} s; faults: "
            + TIMELINE_MARKS
        )
        lines += format_timeline(r["timeline"])
    for phase in ("calm", "faulted"):
        t = r.get(f"time_{phase}")
        if t:
            lines.append(
                f"  caller time, {phase:<7} keys {t['keys']}: {t['total_s']:g} s = before the "
                f"tool started {t['before_start_s']:g} + running {t['running_s']:g} + after it "
                f"ended {t['after_end_s']:g} + never ran {t['never_ran_s']:g} (pauses "
                f"{t['pauses_s']:g} included); slow start/answer (> {SLOW_S:g} s) "
                f"{t['slow_start']} / {t['slow_answer']}; per answer {t['attempt_s']}"
            )
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
