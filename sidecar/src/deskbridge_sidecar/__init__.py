"""deskbridge-sidecar: a trio daemon that dials out to the hub and runs tools locally.

Embedding::

    import trio
    from deskbridge_sidecar import Daemon, ToolRegistry, tool

    @tool(side_effects=True)
    async def click(selector: str) -> dict:
        ...

    async def main():
        daemon = Daemon("ws://127.0.0.1:8080", token, registry=ToolRegistry([click]))
        async with trio.open_nursery() as nursery:
            session_id = await nursery.start(daemon.run)   # after the first welcome
            ...
            daemon.stop()

Fakes for tests live in :mod:`deskbridge_sidecar.testing`.
"""

from ._backoff import Backoff
from ._consent import ApprovalDesk, ApprovalRequest, FileDesk, needs_approval
from ._daemon import (
    CONNECT_FAILED,
    IMMEDIATE_RECONNECT_CODES,
    REJECTED,
    Daemon,
    DaemonStatistics,
    run_daemon,
)
from ._dedupe import DedupeCache
from ._errors import (
    ConnectFailed,
    HandshakeRejected,
    ProxyAuthFailed,
    ProxyRefused,
    TokenRefused,
    TransportClosed,
)
from ._isolate import isolated
from ._outcome import (
    BAD_ARGS,
    BAD_RESULT,
    CANCELLED,
    CRASHED,
    EXPIRED,
    TOOL_ERROR,
    UNKNOWN_TOOL,
    Outcome,
)
from ._progress import PROGRESS_INTERVAL_S, Progress, ProgressUpdate
from ._proxy import Proxy, proxy_from_env
from ._runner import ToolRunner
from ._session import (
    CLOCK_GAP,
    CLOSED,
    INTERNAL_ERROR,
    PING_TIMEOUT,
    PROTOCOL_ERROR,
    STOPPED,
    WELCOME_TIMEOUT,
    Session,
    SessionEnd,
)
from ._tools import (
    STATUS_SPEC,
    STATUS_TOOL,
    ArgsInvalid,
    Tool,
    ToolError,
    ToolRegistry,
    invoke,
    tool,
    tool_of,
)
from ._transport import (
    SIDECAR_PATH,
    Connector,
    Transport,
    WebSocketConnector,
    WebSocketSettings,
    sidecar_url,
)
from ._version import __version__
from ._watchdog import ClockGap, watch_clocks

__all__ = [
    "PROGRESS_INTERVAL_S",
    "Progress",
    "ProgressUpdate",
    "ArgsInvalid",
    "BAD_ARGS",
    "BAD_RESULT",
    "CANCELLED",
    "CLOCK_GAP",
    "CLOSED",
    "CONNECT_FAILED",
    "CRASHED",
    "EXPIRED",
    "IMMEDIATE_RECONNECT_CODES",
    "INTERNAL_ERROR",
    "PING_TIMEOUT",
    "PROTOCOL_ERROR",
    "REJECTED",
    "SIDECAR_PATH",
    "STATUS_SPEC",
    "STATUS_TOOL",
    "STOPPED",
    "TOOL_ERROR",
    "UNKNOWN_TOOL",
    "WELCOME_TIMEOUT",
    "ApprovalDesk",
    "ApprovalRequest",
    "Backoff",
    "ClockGap",
    "ConnectFailed",
    "Connector",
    "Daemon",
    "DaemonStatistics",
    "DedupeCache",
    "FileDesk",
    "HandshakeRejected",
    "Outcome",
    "Proxy",
    "ProxyAuthFailed",
    "ProxyRefused",
    "Session",
    "SessionEnd",
    "TokenRefused",
    "Tool",
    "ToolError",
    "ToolRegistry",
    "ToolRunner",
    "Transport",
    "TransportClosed",
    "WebSocketConnector",
    "WebSocketSettings",
    "__version__",
    "invoke",
    "isolated",
    "needs_approval",
    "proxy_from_env",
    "run_daemon",
    "sidecar_url",
    "tool",
    "tool_of",
    "watch_clocks",
]
