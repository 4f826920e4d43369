"""``_catalogue`` at its edges: the wall clock moved between the hub's acknowledgement
(recorded on the wall clock: it may be an earlier run's) and now; the first start after
an upgrade, over a record an older sidecar wrote."""

from __future__ import annotations

import hashlib
import json

from deskbridge_common import Job
from deskbridge_sidecar import Tool
from deskbridge_sidecar._catalogue import catalogue_at_start, validated_before_change
from deskbridge_sidecar._ledger import Ledger
from deskbridge_sidecar._tools import ToolRegistry

WALL = 1_700_000_000.0


def _job(waited_s: float | None) -> Job:
    return Job("d1", "j1", "submit", {}, "k1", WALL + 60, waited_s=waited_s)


def test_a_clock_set_back_after_an_acknowledgement_refuses_no_job_enqueued_in_this_run():
    """An earlier run was welcomed (and recorded the change's acknowledgement) while the
    laptop's clock read an hour ahead; NTP set it back since. This run offers the same
    fingerprint and was welcomed 400 s ago (monotonic): a job enqueued 2 s ago was
    validated against it. Before: refused ``catalogue_changed`` (its enqueue time, on
    the corrected clock, lies "before" the acknowledgement) for the whole hour."""
    refused = validated_before_change(
        _job(2.0),
        changed=frozenset(),
        changed_at={"submit": WALL + 3600},
        serving_since=100.0,
        now=500.0,
        wall_now=WALL,
    )
    assert not refused


def test_a_job_enqueued_before_this_run_was_welcomed_is_still_judged_on_the_wall_clock():
    """The monotonic clock covers this run only: older jobs are compared with the
    recorded acknowledgement as before (it is 30 s old, the job 600 s)."""
    refused = validated_before_change(
        _job(600.0),
        changed=frozenset(),
        changed_at={"submit": WALL - 30},
        serving_since=100.0,
        now=500.0,
        wall_now=WALL,
    )
    assert refused


async def submit(form: str = "") -> str:
    return form


def _as_older_sidecars_recorded(tool: Tool) -> str:
    """The fingerprint sidecars wrote before it named the function (their formula)."""
    spec = tool.spec()
    entry = [spec.name, spec.description, spec.args_schema, spec.side_effects,
             spec.approval_after_wait_s, tool.config]  # fmt: skip
    text = json.dumps(entry, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


async def test_the_first_start_after_an_upgrade_finds_an_unchanged_tool_unchanged():
    """The ledger holds the catalogue an older sidecar recorded (name -> fingerprint,
    without the function). The same tool after the upgrade is not a changed tool.
    Before: every tool read as changed, so every job queued across the upgrade's
    restart was refused ``catalogue_changed``. The record is rewritten in the new form."""
    tool = Tool.from_function(submit)
    ledger = Ledger.memory()
    older = json.dumps({"submit": _as_older_sidecars_recorded(tool)})
    ledger._conn.execute("INSERT OR REPLACE INTO meta VALUES ('catalogue', ?)", (older,))
    registry = ToolRegistry()
    registry.add(tool)
    found = await catalogue_at_start(ledger, registry)
    assert found.changed == frozenset()
    assert (await ledger.catalogue())["submit"] == (tool.fingerprint(), 0.0)


async def test_a_tool_changed_across_the_upgrade_is_still_changed():
    async def other(form: str = "", when: int = 0) -> str:
        return form

    ledger = Ledger.memory()
    older = json.dumps({"submit": _as_older_sidecars_recorded(Tool.from_function(submit))})
    ledger._conn.execute("INSERT OR REPLACE INTO meta VALUES ('catalogue', ?)", (older,))
    registry = ToolRegistry()
    registry.add(Tool.from_function(other, name="submit"))
    assert (await catalogue_at_start(ledger, registry)).changed == frozenset({"submit"})
