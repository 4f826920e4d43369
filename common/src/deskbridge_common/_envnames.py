"""The ``DESKBRIDGE_*`` names hub and sidecar read, and the misspelt ones in an
environment (both warn at start: ``deskbridge_hub._envcheck``, ``deskbridge-sidecar run``).

A misspelt variable (``DESKBRIDGE_REDIS_ULR``) is otherwise ignored silently and the process
runs on a default the operator did not choose. Every variable the product reads is listed
here (a test scans the source tree for ``DESKBRIDGE_`` names and fails when one is
missing, so a new knob cannot be forgotten); anything else with the prefix gets one
WARNING naming it and the nearest known name (difflib, the standard library's fuzzy match).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping

import attrs

from ._timings import Timings

PREFIX = "DESKBRIDGE_"

#: Variables read by the hub, the sidecar or the command-line tools, beyond the timing
#: knobs (``DESKBRIDGE_<TIMING FIELD>``, added below from :class:`Timings`). Sidecar names
#: are listed too: a hub and a sidecar often share a developer's shell.
KNOWN: frozenset[str] = frozenset(
    {
        "DESKBRIDGE_REDIS_URL",
        "DESKBRIDGE_REDIS_MAX_CONNECTIONS",
        "DESKBRIDGE_SECRET",
        "DESKBRIDGE_PREVIOUS_SECRETS",
        "DESKBRIDGE_API_KEY",
        "DESKBRIDGE_MAX_INFLIGHT",
        "DESKBRIDGE_MAX_ARGS_BYTES",
        "DESKBRIDGE_MAX_CALLS",
        "DESKBRIDGE_SHED_LAG_S",
        "DESKBRIDGE_TOKEN_LEEWAY_S",
        "DESKBRIDGE_LOG_LEVEL",
        "DESKBRIDGE_LOG_FORMAT",
        "DESKBRIDGE_HUB_HTTP",
        "DESKBRIDGE_HUB_URL",
        "DESKBRIDGE_TOKEN",
        "DESKBRIDGE_DATA_DIR",
        "DESKBRIDGE_CONFIG",
        "DESKBRIDGE_NO_KEYRING",
        "DESKBRIDGE_VENV",
        "DESKBRIDGE_FILES_ROOTS",
        "DESKBRIDGE_BROWSER_ORIGINS",
        "DESKBRIDGE_BROWSER_PROFILE",
        "DESKBRIDGE_BROWSER_EXECUTABLE",
        "DESKBRIDGE_BROWSER_HEADLESS",
    }
) | frozenset("DESKBRIDGE_" + f.name.upper() for f in attrs.fields(Timings))

#: Prefixes of names that belong to the test suite and CI, never warned about.
IGNORED_PREFIXES = ("DESKBRIDGE_TEST_",)


def known_names() -> frozenset[str]:
    """Every ``DESKBRIDGE_*`` name the product reads (see :data:`KNOWN`)."""
    return KNOWN


def unknown_variables(
    environ: Mapping[str, str] | None = None,
) -> list[tuple[str, str | None]]:
    """The ``DESKBRIDGE_*`` variables in ``environ`` that nothing reads.

    Args:
        environ: the environment to check (default ``os.environ``).

    Returns:
        ``(name, nearest known name or None)`` for each unknown variable, sorted by name.
    """
    env = os.environ if environ is None else environ
    found = []
    for name in sorted(env):
        if not name.startswith(PREFIX) or name in KNOWN or name.startswith(IGNORED_PREFIXES):
            continue
        # Compare without the shared prefix, which would make every name look close.
        tails = sorted(k[len(PREFIX) :] for k in KNOWN)
        close = difflib.get_close_matches(name[len(PREFIX) :], tails, n=1, cutoff=0.6)
        found.append((name, PREFIX + close[0] if close else None))
    return found


def unknown_variable_lines(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per unknown variable: ``unknown environment variable DESKBRIDGE_REDIS_ULR
    is ignored; did you mean DESKBRIDGE_REDIS_URL?``."""
    lines = []
    for name, nearest in unknown_variables(environ):
        hint = f"; did you mean {nearest}?" if nearest else ""
        lines.append(f"unknown environment variable {name} is ignored{hint}")
    return lines


def misspelling_hint(name: str, environ: Mapping[str, str] | None = None) -> str:
    """What to append to an error saying the required variable ``name`` is not set: ``"
    (DESKBRIDGE_SECRT is set: did you mean DESKBRIDGE_SECRET?)"`` when ``environ`` (default
    ``os.environ``) holds unknown variables whose nearest known name is ``name``, else "".

    The start-up warning about unknown variables (:func:`unknown_variable_lines`) is far
    from the one-line error a missing variable gets, and the commands that need one
    (``token``, ``call``, ``revoke``, ``deskbridge-sidecar run``) printed no warning."""
    typos = [typo for typo, nearest in unknown_variables(environ) if nearest == name]
    if not typos:
        return ""
    return f" ({', '.join(typos)} {'is' if len(typos) == 1 else 'are'} set: did you mean {name}?)"
