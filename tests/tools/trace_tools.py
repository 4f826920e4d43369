"""Tools that report the trace context they run in (``--tools trace_tools``)."""

from __future__ import annotations

from deskbridge_sidecar import tool
from opentelemetry import propagate


def _traceparent() -> str | None:
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent")


@tool
async def traceparent_async() -> str | None:
    """The traceparent current while this async tool runs."""
    return _traceparent()


@tool
def traceparent_sync() -> str | None:
    """The traceparent current while this sync tool runs (in a worker thread)."""
    return _traceparent()
