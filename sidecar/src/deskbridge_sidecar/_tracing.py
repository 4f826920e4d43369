"""Run each tool in its caller's trace (W3C ``traceparent`` from the ``job`` frame).

OpenTelemetry API only: without an SDK the span records nothing, but the caller's trace
context is current while the tool runs (a tool can read or forward it; log lines carry
its trace id). With an SDK and an exporter configured in the sidecar's process, the span
``tool <name>`` appears as a child of the caller's span.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from deskbridge_common import Job
from opentelemetry import propagate, trace

tracer = trace.get_tracer("deskbridge_sidecar")


@contextlib.contextmanager
def tool_span(job: Job) -> Iterator[None]:
    """A span for running ``job``'s tool, child of the caller's trace when the frame
    carries a ``traceparent`` (a malformed one starts no trace: the job runs anyway)."""
    carrier = {"traceparent": job.traceparent} if job.traceparent else {}
    parent = propagate.extract(carrier)
    attributes = {"deskbridge.job_id": job.job_id, "deskbridge.tool": job.name}
    with tracer.start_as_current_span(
        f"tool {job.name}", context=parent, kind=trace.SpanKind.CONSUMER, attributes=attributes
    ):
        yield


def trace_id(traceparent: str | None) -> str | None:
    """The trace id field of a ``traceparent`` (for log lines), or None."""
    parts = (traceparent or "").split("-")
    return parts[1] if len(parts) >= 4 and len(parts[1]) == 32 else None
