"""Tools in a separate process, so they cannot starve the connection (issue 12 item 7).

A sync tool runs in a worker thread, which is enough while it releases the GIL (I/O,
most C libraries). A long C call that holds the GIL (41-59 s of ``sum(range(n))`` in the
field) stops every other thread *and* the event loop: no pong for 20 s, close 4002,
presence offline for half a minute. Such a tool runs in a child process instead:

    @isolated
    @tool
    def crunch(n: int) -> int:
        return sum(range(n))

or every sync tool at once (``deskbridge-sidecar run --isolate-sync-tools``,
``Daemon(isolate_sync_tools=True)``).

The child is ``python -m deskbridge_sidecar._isolate MODULE QUALNAME NAME`` with the
daemon's import path: it imports the tool's module, finds the function, runs it through
the same :func:`~deskbridge_sidecar._tools.invoke` (argument conversion, ``ToolError``,
``crashed``, result checks) and writes the outcome as one JSON line on its stdout (the
tool's own prints go to stderr). Arguments go in on stdin. One process per run: its
start costs a Python start-up (about 0.1-0.5 s), which is why it is opt-in.

Cancellation (the hub's cancel, the daemon's shutdown) terminates the child (SIGTERM,
then SIGKILL after ``KILL_AFTER_S``): unlike a thread, a process tool can be stopped.
A tool defined where a fresh interpreter cannot import it (``__main__``, a closure) is
answered ``crashed`` with the reason; nothing runs.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import trio

from ._outcome import CRASHED, Outcome
from ._tools import Tool

#: Attribute ``@isolated`` sets on a tool's function.
_MARK = "__deskbridge_isolated__"
#: Seconds between SIGTERM and SIGKILL when a process tool is cancelled.
KILL_AFTER_S = 2.0


def isolated(fn: Any) -> Any:
    """Mark a tool's function to run in a separate process (above or below ``@tool``).

    Returns:
        ``fn`` unchanged (marked).
    """
    setattr(fn, _MARK, True)
    return fn


def is_isolated(tool: Tool) -> bool:
    """True if ``tool`` was marked with :func:`isolated`."""
    return bool(getattr(tool.fn, _MARK, False))


async def _terminate(process: trio.Process) -> None:
    process.send_signal(signal.SIGTERM)
    with trio.move_on_after(KILL_AFTER_S):
        await process.wait()
        return
    process.kill()


async def invoke_in_process(tool: Tool, args: dict[str, Any]) -> Outcome:
    """Run ``tool`` once with ``args`` in a child process; the same outcomes as
    :func:`~deskbridge_sidecar._tools.invoke`, plus ``crashed`` if the child could not
    run it (not importable, killed, no answer).

    Raises:
        trio.Cancelled: the child is terminated (SIGTERM, SIGKILL after
            ``KILL_AFTER_S``) before the cancellation propagates.
    """
    from ._outcome import outcome_from_json

    module = getattr(tool.fn, "__module__", None)
    qualname = getattr(tool.fn, "__qualname__", "")
    if not module or module == "__main__" or "<locals>" in qualname:
        return Outcome.failure(
            CRASHED,
            f"{tool.name} cannot run in a separate process: {module}.{qualname} is not "
            "importable by a fresh interpreter (define it at the top level of a module)",
        )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)}
    command = [sys.executable, "-m", "deskbridge_sidecar._isolate", module, qualname, tool.name]
    result = await trio.run_process(
        command,
        stdin=json.dumps(args).encode(),
        capture_stdout=True,
        stderr=None,
        check=False,
        env=env,
        deliver_cancel=_terminate,
    )
    lines = result.stdout.decode("utf-8", "replace").strip().splitlines()
    if result.returncode != 0 or not lines:
        return Outcome.failure(
            CRASHED,
            f"{tool.name}'s process ended with status {result.returncode} without an answer",
        )
    try:
        return outcome_from_json(lines[-1])
    except (ValueError, KeyError, TypeError) as exc:
        return Outcome.failure(CRASHED, f"{tool.name}'s process answered garbage: {exc!r}")


def _child(module: str, qualname: str, name: str) -> int:
    import importlib

    from ._outcome import outcome_to_json
    from ._tools import ToolRegistry, invoke, tool_of

    answer = sys.stdout
    sys.stdout = sys.stderr  # the tool's prints must not corrupt the answer
    args = json.loads(sys.stdin.read() or "{}")
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        found = tool_of(obj) or ToolRegistry([obj], builtins=False).get(name)
        if found is None:
            raise LookupError(f"{module}.{qualname} is not a tool")
        outcome = trio.run(invoke, found, args)
    except Exception as exc:  # noqa: BLE001 - reported as the run's outcome
        outcome = Outcome.failure(CRASHED, f"could not run {name} in its process: {exc!r}")
    answer.write(outcome_to_json(outcome) + "\n")
    answer.flush()
    return 0


if __name__ == "__main__":  # pragma: no cover - run as the child
    sys.exit(_child(*sys.argv[1:4]))


__all__ = ["KILL_AFTER_S", "invoke_in_process", "is_isolated", "isolated"]
