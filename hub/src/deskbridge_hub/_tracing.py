"""W3C trace context, carried from the caller to the tool (OpenTelemetry API only).

The hub records no spans and exports nothing: it only carries the caller's
``traceparent`` on the stream entry and the ``job`` frame, so the sidecar runs the tool
in the caller's trace (and an exporter configured there shows the desktop's part under
the caller's span). A Python caller with an OpenTelemetry SDK gets this for free from its
current span (``Bridge.dispatch`` injects it); an HTTP caller sends a ``traceparent``
header, which the API extracts for the duration of the call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import context, propagate


def current_traceparent() -> str | None:
    """The ``traceparent`` of the current OpenTelemetry context, or None (no valid span)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent")


def extracted(headers: Mapping[str, Any]) -> contextlib.AbstractContextManager[None]:
    """Make the trace context in ``headers`` (``traceparent``, ``tracestate``) current
    for the block; headers without one (or a malformed one) change nothing.

    Headers without ``traceparent`` (looked up as the mapping looks names up: ASGI's
    are lower-case, Werkzeug's ignore case) skip the propagator and the context
    machinery: most requests carry none, and the job route is hot (issue 10)."""
    if "traceparent" not in headers:
        return _UNCHANGED
    return _attached(headers)


#: ``nullcontext`` is reentrant and reusable: one for every request without a trace.
_UNCHANGED: contextlib.nullcontext[None] = contextlib.nullcontext()


@contextlib.contextmanager
def _attached(headers: Mapping[str, Any]) -> Iterator[None]:
    token = context.attach(propagate.extract(headers))
    try:
        yield
    finally:
        context.detach(token)


def trace_id(traceparent: str | None) -> str | None:
    """The trace id field of a ``traceparent`` (for log lines), or None."""
    if not traceparent:
        return None
    parts = traceparent.split("-")
    return parts[1] if len(parts) >= 4 and len(parts[1]) == 32 else None
