"""Where a hub process's CPU goes: py-spy (a sampling profiler, bench-only dependency)
attached to a running pid, its collapsed stacks summarised.

``Profiler(pid, out_path).start()`` runs ``py-spy record --format raw --nonblocking``
until ``stop()``; ``summarise(path)`` returns the hottest frames by self time (the
innermost frame of each sample) and by inclusive time (any frame on the stack), and the
share of samples per top-level area (our packages, trio, hypercorn, coredis, ...).
Only samples of a running thread are recorded (py-spy leaves idle threads out), so the
percentages are of the CPU the process used, not of wall time.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

PYSPY = Path(sys.executable).parent / "py-spy"

#: Frame file paths -> an area name, first match wins.
AREAS = [
    ("deskbridge_hub", "deskbridge_hub"),
    ("deskbridge_common", "deskbridge_common"),
    ("/coredis/", "coredis"),
    ("/hypercorn/", "hypercorn"),
    ("/quart_trio/", "quart/quart-trio"),
    ("/quart/", "quart/quart-trio"),
    ("/werkzeug/", "quart/quart-trio"),
    ("/wsproto/", "wsproto"),
    ("/h11/", "h11"),
    ("/trio/", "trio"),
    ("/anyio/", "anyio"),
    ("/json/", "json"),
    ("/logging/", "logging"),
    ("/jsonschema", "jsonschema"),
    ("/attr", "attrs"),
]


class Profiler:
    def __init__(self, pid: int, out: Path, rate: int = 250, *, gil: bool = False) -> None:
        self.pid = pid
        #: Only samples of a thread holding the GIL (py-spy ``--gil``): a socket send
        #: or receive releases it, so time the process spends in (or preempted in) a
        #: syscall drops out. On a loaded machine the default attributes that wall time
        #: to ``_nonblocking_helper`` (40 % of the hub's samples at load 10).
        self.gil = gil
        self.out = out
        self.rate = rate
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                str(PYSPY),
                "record",
                "--pid",
                str(self.pid),
                "--format",
                "raw",
                "--rate",
                str(self.rate),
                "--nonblocking",
                *(["--gil"] if self.gil else []),
                "--output",
                str(self.out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def _frames(stack: str) -> list[str]:
    return [
        f
        for f in stack.split(";")
        if f and not f.startswith("process ") and not f.startswith("thread ")
    ]


def _area(frame: str) -> str:
    for needle, name in AREAS:
        if needle in frame:
            return name
    m = re.search(r"\((?:<frozen )?([^:)]+)", frame)
    return "stdlib/other: " + Path(m.group(1)).name if m else "other"


#: Frames of the event loop and its socket/task plumbing; the innermost frame outside
#: them is the "call site" that spent the time (e.g. coredis's writer task sending).
PLUMBING = (
    "(trio/",
    "(anyio/",
    "(asyncio/",
    "(selectors.py",
    "(socket.py",
    "(contextlib.py",
    "(<attrs generated",
    "(outcome/",
)

#: Innermost frames that mean "waiting for I/O" (the event loop's poll): with
#: --nonblocking py-spy cannot always tell an idle thread, so these are left out.
IDLE = ("EpollIOManager.get_events", "EpollSelector.select", "epoll.poll")


def _task_root(frames: list[str]) -> str:
    """The frame a trio task started in: the one right below the scheduler's last
    ``unrolled_run`` frame (the scheduler itself when there is none below it)."""
    below = [i for i, f in enumerate(frames) if f.startswith("unrolled_run")]
    if not below or below[-1] + 1 >= len(frames):
        return "(trio scheduler) " + frames[-1]
    return frames[below[-1] + 1]


def summarise(path: Path, top: int = 25) -> str:
    """The report text for one raw py-spy file."""
    self_counts: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    areas: Counter[str] = Counter()
    sites: Counter[str] = Counter()
    tasks: Counter[str] = Counter()
    total = idle = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        frames = _frames(stack)
        if not frames:
            continue
        if frames[-1].startswith(IDLE):
            idle += count
            continue
        total += count
        self_counts[frames[-1]] += count
        site = next((f for f in reversed(frames) if not any(p in f for p in PLUMBING)), frames[-1])
        sites[site] += count
        tasks[_task_root(frames)] += count
        for f in set(frames):
            incl[f] += count
        # the area of the innermost frame that belongs to a known area
        leaf_area = next(
            (_area(f) for f in reversed(frames) if not _area(f).startswith("stdlib")),
            _area(frames[-1]),
        )
        areas[leaf_area] += count
    if not total:
        return f"{path.name}: no samples"
    lines = [
        f"{path.name}: {total} busy samples ({idle} more waiting in the event loop's poll, "
        "left out; percentages are of busy samples)"
    ]
    lines.append("  by area (innermost frame of a known package):")
    for name, n in areas.most_common(14):
        lines.append(f"    {100 * n / total:5.1f} %  {name}")
    lines.append("  call sites (innermost frame outside trio/anyio/asyncio/socket plumbing):")
    for f, n in sites.most_common(top):
        lines.append(f"    {100 * n / total:5.1f} %  {f}")
    lines.append("  by task (the outermost frame of the trio task, below the scheduler):")
    for f, n in tasks.most_common(15):
        lines.append(f"    {100 * n / total:5.1f} %  {f}")
    lines.append("  self time (innermost frame):")
    for f, n in self_counts.most_common(top):
        lines.append(f"    {100 * n / total:5.1f} %  {f}")
    lines.append("  inclusive time, deskbridge frames:")
    ours = [(f, n) for f, n in incl.most_common() if "deskbridge" in f]
    for f, n in ours[:top]:
        lines.append(f"    {100 * n / total:5.1f} %  {f}")
    return "\n".join(lines)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(summarise(Path(arg)))
