"""deskbridge-hub: relays jobs from any backend replica to a user's sidecar.

Public API: :class:`Bridge` (dispatch), :func:`create_app` (the ASGI app),
:class:`HubConfig`, the typed errors, the substrates and token helpers.
"""

from typing import Any

from ._app import create_app
from ._bridge import Bridge
from ._config import HubConfig
from ._errors import (
    BadRequest,
    BridgeError,
    DesktopOffline,
    IdempotencyKeyReused,
    JobCancelled,
    JobDeclined,
    JobExpired,
    JobFailed,
    JobIdInUse,
    JobInDoubt,
    JobLost,
    JobTimeout,
    Overloaded,
    QueueFull,
    SubstrateUnavailable,
    UnknownJob,
)
from ._outcome import Outcome, Presence
from ._substrate import Claimed, Entry, Substrate
from ._tokens import TokenExpired, TokenNotYetValid, TokenRejected, issue_token, verify_token

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Substrates load lazily so importing the package does not import the Redis client.
    if name == "MemorySubstrate":
        from ._memory import MemorySubstrate

        return MemorySubstrate
    if name == "RedisSubstrate":
        from ._redis import RedisSubstrate

        return RedisSubstrate
    raise AttributeError(name)


__all__ = [
    "BadRequest",
    "Bridge",
    "BridgeError",
    "Claimed",
    "DesktopOffline",
    "Entry",
    "HubConfig",
    "JobCancelled",
    "JobDeclined",
    "JobInDoubt",
    "JobExpired",
    "JobFailed",
    "IdempotencyKeyReused",
    "JobIdInUse",
    "JobLost",
    "JobTimeout",
    "MemorySubstrate",
    "Outcome",
    "Presence",
    "Overloaded",
    "QueueFull",
    "RedisSubstrate",
    "Substrate",
    "SubstrateUnavailable",
    "TokenExpired",
    "TokenNotYetValid",
    "TokenRejected",
    "UnknownJob",
    "create_app",
    "issue_token",
    "verify_token",
]
