"""Which catalogue a queued job was validated against: the one the hub last acknowledged.

The hub checks a call against the catalogue of the desktop's last *welcomed* hello (it
stores the catalogue before it sends ``welcome``). A job that waits in the hub's queue
while the sidecar restarts with another definition or configuration of its tool must
not run under the new meaning (``catalogue_changed``, docs/outcomes.md "Tool
catalogue"). The ledger keeps, per tool (:meth:`Ledger.catalogue`):

* the fingerprint (:meth:`Tool.fingerprint`) the hub acknowledged, written when a
  session is welcomed (:func:`acknowledge`), never at start-up: a start the hub never
  heard of (unreachable, stopped at once) changes nothing the hub validates against;
* when the hub first acknowledged that fingerprint after a change (Unix seconds; 0.0
  when no change is known): a job enqueued before that moment was validated against
  the older fingerprint, whichever start (this one or an earlier one) made the change.

At start (:func:`catalogue_at_start`) a tool whose fingerprint is not the acknowledged
one is *changed*: every job of it enqueued before this daemon's first welcome is refused
(the runner measures that on the monotonic clock). A tool acknowledged after a change
refuses the jobs enqueued before that acknowledgement (on the wall clock: it may be an
earlier run's). A tool the ledger has no record of (a new ledger, a new tool) refuses
nothing, and its fingerprint is recorded at once as the baseline.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import attrs
from deskbridge_common import Job

from ._ledger import Ledger
from ._tools import ToolRegistry

log = logging.getLogger("deskbridge.sidecar")

#: Jobs enqueued up to this long after the welcome that acknowledged a change still
#: count as validated against the previous catalogue (the hub stores the new one at the
#: hello; the job frame's transit makes a job look older here), seconds.
CATALOGUE_SLACK_S = 1.0
#: How long a job the hub sent without its age (``waited_s``: an older hub) can have
#: waited, seconds: the hub's longest ``timeout_s``, a day. Such a job of a tool
#: acknowledged after a change less than this ago cannot be told apart, so is refused.
UNKNOWN_AGE_S = 24 * 3600.0


@attrs.frozen
class CatalogueAtStart:
    """What :func:`catalogue_at_start` found.

    Attributes:
        fingerprints: tool name -> fingerprint, as offered by this start.
        changed: tools whose fingerprint is not the one the hub last acknowledged.
        changed_at: tools offered unchanged since the hub acknowledged them after a
            change -> Unix seconds of that acknowledgement.
    """

    fingerprints: Mapping[str, str]
    changed: frozenset[str]
    changed_at: Mapping[str, float]


async def catalogue_at_start(ledger: Ledger, registry: ToolRegistry) -> CatalogueAtStart:
    """Compare ``registry`` with the catalogue the hub acknowledged; record the
    fingerprint of a tool never recorded before (the baseline), and the current form of
    one an older sidecar recorded unchanged, nothing else.

    Raises:
        LedgerError: the ledger cannot be read or written.
    """
    current = {t.name: t.fingerprint() for t in registry}
    record = await ledger.catalogue()
    # A record an older sidecar wrote (its fingerprint without the function): the same
    # tool is unchanged, and its record is rewritten in the current form (else every
    # tool read as changed at the first start after an upgrade).
    upgraded = {
        t.name: (current[t.name], record[t.name][1])
        for t in registry
        if t.name in record
        and record[t.name][0] != current[t.name]
        and record[t.name][0] == t.fingerprint(earlier=True)
    }
    record.update(upgraded)
    changed = frozenset(n for n, fp in current.items() if n in record and record[n][0] != fp)
    changed_at = {
        n: record[n][1] for n in current if n in record and n not in changed and record[n][1]
    }
    new = {n: (fp, 0.0) for n, fp in current.items() if n not in record}
    if new or upgraded:
        await ledger.record_catalogue({**record, **new})
    if changed:
        log.warning(
            "tools changed since the hub last acknowledged them: %s; their jobs queued "
            "before this sidecar is welcomed are refused (catalogue_changed), not run",
            ", ".join(sorted(changed)),
        )
    return CatalogueAtStart(current, changed, changed_at)


async def acknowledge(ledger: Ledger, fingerprints: Mapping[str, str], at: float) -> None:
    """The hub welcomed a hello offering ``fingerprints`` at ``at`` (Unix seconds):
    record them, with ``at`` for each that differs from the recorded one. Tools not
    offered keep their records (a queued job of one may meet it again later).

    Raises:
        LedgerError: the ledger cannot be read or written.
    """
    record = await ledger.catalogue()
    merged = dict(record)
    for name, fp in fingerprints.items():
        old = record.get(name)
        if old is None:
            merged[name] = (fp, 0.0)
        elif old[0] != fp:
            merged[name] = (fp, at)
    if merged != record:
        await ledger.record_catalogue(merged)


def validated_before_change(
    job: Job,
    *,
    changed: frozenset[str],
    changed_at: Mapping[str, float],
    serving_since: float | None,
    now: float,
    wall_now: float,
) -> bool:
    """True if ``job`` may have been validated against an older fingerprint of its tool
    (or that cannot be told), within :data:`CATALOGUE_SLACK_S`. A job enqueued after
    this daemon's first welcome (monotonic clock) never was: that welcome acknowledged
    the fingerprint this run offers; only older jobs are judged on the wall clock.

    Args:
        job: the delivery (``waited_s``: its age when the hub sent it, or None).
        changed: :attr:`CatalogueAtStart.changed`.
        changed_at: :attr:`CatalogueAtStart.changed_at`.
        serving_since: trio time of this daemon's first welcome, or None before it.
        now: trio time (monotonic seconds) now.
        wall_now: Unix seconds now.
    """
    if job.waited_s is None:  # its age cannot be told
        if job.name in changed:
            return True
        at = changed_at.get(job.name)
        return at is not None and wall_now - at < UNKNOWN_AGE_S
    welcomed = serving_since is not None and job.waited_s + CATALOGUE_SLACK_S < now - serving_since
    if job.name in changed:
        return not welcomed
    at = changed_at.get(job.name)
    # Enqueued after this run's first welcome (monotonic): validated against this run's
    # fingerprint, the acknowledged one, whatever the wall clock did since ``at`` (set
    # back by NTP after a welcome while it ran ahead refused every job until it caught up).
    return at is not None and not welcomed and wall_now - job.waited_s < at + CATALOGUE_SLACK_S
