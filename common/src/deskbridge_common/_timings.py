"""Shared timing constants, with units in their names, tunable from the environment.

Defaults are the field-tested values of the seed report (shared/reference), except the
heartbeat: 30 s (the field's 10 s, lengthened by issue 10 so that 10,000 idle desktops
cost one hub process little: presence now also needs its holder process's liveness key,
refreshed every second, so a dead process reads offline within seconds whatever the
heartbeat; docs/architecture.md), presence TTL 3 x heartbeat (a blip shorter than two
heartbeats must not read as a disconnect), stream MAXLEN ~ 500, reclaim idle 180 s
(longer than the longest legitimate browser job, 60-120 s), result TTL 300 s, requester
wait 90 s (the seed's BLPOP), dedupe cache 256 outcomes for 300 s (mirrors the result
TTL), sleep/wedge gap 5 s. Reconnect backoff: first window 0.5 s (so a desktop whose
healthy session dropped is back within 1 s at p99, connect time included: issue 16),
doubling to 30 s while attempts fail.

Every field can be overridden with ``DESKBRIDGE_<FIELD NAME IN UPPER CASE>``, for example
``DESKBRIDGE_RECLAIM_IDLE_S=5``. The table in docs/operations.md lists them all.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import TypeVar

import attrs

_Number = TypeVar("_Number", int, float)


def _positive(instance: object, attribute: attrs.Attribute[_Number], value: _Number) -> None:
    # finite too: an infinite timing (DESKBRIDGE_GRACE_S=inf) is a drain, a deadline or a
    # TTL that never ends (and Redis refuses an infinite PEXPIRE at the first use)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{attribute.name} must be a positive finite number, got {value!r}")


#: Longest call (``call_timeout_s``, the default wait) and drain (``grace_s``): one day,
#: the bound the hub puts on a request's ``timeout_s`` and on ``serve
#: --graceful-timeout-s``. A larger default made every call without its own
#: ``timeout_s`` a 400 naming a field its caller never sent.
MAX_WAIT_S = 24 * 3600.0


#: Largest count (``jobs_maxlen``, ``dedupe_size``): a million entries.
MAX_COUNT = 1_000_000


def _bounded(instance: object, attribute: attrs.Attribute[_Number], value: _Number) -> None:
    # Every knob has a ceiling: DESKBRIDGE_RESULT_TTL_S=1e30 (or READ_BLOCK_MS=1e20) was
    # taken, and Redis refused the PEXPIRE / BLOCK at the first session ("value is not an
    # integer or out of range": every handshake ended 1011). No timing needs more than a
    # day (calls and drains are bounded by one already); counts stop at a million.
    if attribute.name.endswith("_ms"):
        most, unit = MAX_WAIT_S * 1000, " ms"
    elif attribute.name.endswith("_s"):
        most, unit = MAX_WAIT_S, " s"
    else:
        most, unit = MAX_COUNT, ""
    if value > most:
        raise ValueError(f"{attribute.name} must be at most {most:.0f}{unit}, got {value!r}")


def _is_float(raw: str) -> bool:
    try:
        float(raw)
    except ValueError:
        return False
    return True


@attrs.frozen(kw_only=True)
class Timings:
    """Every timing knob of hub and sidecar. Seconds unless the name says otherwise."""

    heartbeat_s: float = attrs.field(default=30.0, validator=[_positive, _bounded])
    presence_ttl_s: float = attrs.field(default=90.0, validator=[_positive, _bounded])
    jobs_maxlen: int = attrs.field(default=500, validator=[_positive, _bounded])
    reclaim_idle_s: float = attrs.field(default=180.0, validator=[_positive, _bounded])
    result_ttl_s: float = attrs.field(default=300.0, validator=[_positive, _bounded])
    call_timeout_s: float = attrs.field(default=90.0, validator=[_positive, _bounded])
    read_block_ms: int = attrs.field(default=2000, validator=[_positive, _bounded])
    ping_interval_s: float = attrs.field(default=30.0, validator=[_positive, _bounded])
    ping_timeout_s: float = attrs.field(default=10.0, validator=[_positive, _bounded])
    close_timeout_s: float = attrs.field(default=5.0, validator=[_positive, _bounded])
    dedupe_size: int = attrs.field(default=256, validator=[_positive, _bounded])
    dedupe_ttl_s: float = attrs.field(default=300.0, validator=[_positive, _bounded])
    wedge_gap_s: float = attrs.field(default=5.0, validator=[_positive, _bounded])
    watchdog_interval_s: float = attrs.field(default=1.0, validator=[_positive, _bounded])
    backoff_initial_s: float = attrs.field(default=0.5, validator=[_positive, _bounded])
    backoff_max_s: float = attrs.field(default=30.0, validator=[_positive, _bounded])
    grace_s: float = attrs.field(default=20.0, validator=[_positive, _bounded])

    def __attrs_post_init__(self) -> None:
        if self.presence_ttl_s <= self.heartbeat_s:
            raise ValueError(
                f"presence_ttl_s ({self.presence_ttl_s:g}) must exceed heartbeat_s "
                f"({self.heartbeat_s:g}), or presence lapses between heartbeats"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Timings:
        """Build from ``DESKBRIDGE_<NAME>`` variables, defaults for the rest.

        Raises:
            ValueError: a variable is not a number, or not positive and finite; the message
                names it.
        """
        environ = os.environ if environ is None else environ
        values: dict[str, float | int] = {}
        for field in attrs.fields(cls):
            var = "DESKBRIDGE_" + field.name.upper()
            if var in environ:
                raw = environ[var]
                whole = field.type in (int, "int")
                try:
                    values[field.name] = int(raw) if whole else float(raw)
                except ValueError:
                    kind = "a whole number" if whole and _is_float(raw) else "a number"
                    raise ValueError(f"{var}={raw!r} is not {kind}") from None
        try:
            # Each value was parsed by its field's own type (int or float) just above.
            return cls(**values)  # type: ignore[arg-type]
        except ValueError as exc:
            # every field the message names (the ordering check names two: a variable
            # nobody set was blamed alone when the heartbeat was the one raised)
            named = sorted(
                (m.start(), "DESKBRIDGE_" + f.name.upper())
                for f in attrs.fields(cls)
                if (m := re.search(rf"\b{f.name}\b", str(exc)))
            )
            prefix = " and ".join(var for _, var in named) or "DESKBRIDGE_<TIMING>"
            raise ValueError(f"{prefix}: {exc}") from None

    def env_names(self) -> dict[str, str]:
        """Map each field name to its environment variable name."""
        return {f.name: "DESKBRIDGE_" + f.name.upper() for f in attrs.fields(type(self))}
