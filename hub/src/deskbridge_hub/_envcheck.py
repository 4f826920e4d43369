"""Operator-mistake checks on the environment: misspelt ``DESKBRIDGE_*`` variables.

A misspelt variable (``DESKBRIDGE_REDIS_ULR``) is otherwise ignored silently and the hub
runs on a default the operator did not choose. Every variable the product reads is listed
in ``deskbridge_common._envnames`` (the sidecar warns the same way; a test scans the
source tree for ``DESKBRIDGE_`` names and fails when one is missing, so a new knob cannot
be forgotten); anything else with the prefix gets one WARNING naming it and the nearest
known name (difflib, the standard library's fuzzy match).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from deskbridge_common import _envnames

log = logging.getLogger("deskbridge.hub.config")
_checked_process_env = False

PREFIX = _envnames.PREFIX
#: see :data:`deskbridge_common._envnames.KNOWN` (hub and sidecar share it)
KNOWN = _envnames.KNOWN
IGNORED_PREFIXES = _envnames.IGNORED_PREFIXES
known_names = _envnames.known_names
unknown_variables = _envnames.unknown_variables


def warn_unknown_variables(
    environ: Mapping[str, str] | None = None, logger: logging.Logger | None = None
) -> list[str]:
    """Log one WARNING per unknown ``DESKBRIDGE_*`` variable.

    For the process environment (``environ`` None) this logs once per process: ``serve
    --workers 1`` checks before it starts and then imports ``asgi``, which checks again.

    Returns:
        The warning lines logged (empty when every variable is known, or when the process
        environment was already checked).
    """
    global _checked_process_env
    if environ is None:
        if _checked_process_env:
            return []
        _checked_process_env = True
    lines = _envnames.unknown_variable_lines(environ)
    for line in lines:
        (logger or log).warning(line)
    return lines
