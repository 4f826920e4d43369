"""Hub configuration, read from the environment (DESIGN.md, public interface)."""

from __future__ import annotations

import math
import os
import urllib.parse
from collections.abc import Mapping

import attrs
from deskbridge_common import MAX_FRAME_BYTES, Timings

from ._admission import DEFAULT_MAX_CALLS, DEFAULT_SHED_LAG_S
from ._redis_options import query_problem
from ._tokens import MAX_TOKEN_LEEWAY_S, TOKEN_LEEWAY_S

#: ``DESKBRIDGE_REDIS_URL`` value that asks for the in-memory substrate explicitly.
MEMORY_URL = "memory://"
#: Largest ``DESKBRIDGE_MAX_ARGS_BYTES``: the args must fit a ``job`` frame (1 MiB,
#: ``MAX_FRAME_BYTES``) with its other fields (ids, key, deadline, trace context: well
#: under 16 KiB); larger args would be accepted, enqueued and answered ``bad_job``.
MAX_ARGS_BYTES_LIMIT = MAX_FRAME_BYTES - 16 * 1024
#: Default ``DESKBRIDGE_MAX_ARGS_BYTES``: 256 KiB.
DEFAULT_MAX_ARGS_BYTES = 256 * 1024
#: Largest ``DESKBRIDGE_MAX_INFLIGHT``: a sidecar runs one tool at a time, so more jobs
#: handed to one socket only wait there instead of in the user's stream.
MAX_INFLIGHT_LIMIT = 10_000
#: Largest ``DESKBRIDGE_REDIS_MAX_CONNECTIONS``: Redis' default ``maxclients``.
MAX_REDIS_CONNECTIONS_LIMIT = 10_000
#: Largest ``DESKBRIDGE_MAX_CALLS``: each call holds a socket (a file descriptor).
MAX_CALLS_LIMIT = 1_000_000
#: Largest ``DESKBRIDGE_SHED_LAG_S``, seconds.
MAX_SHED_LAG_S = 60.0


@attrs.frozen(kw_only=True)
class HubConfig:
    """Everything a hub process needs.

    Attributes:
        redis_url: ``DESKBRIDGE_REDIS_URL``; ``memory://`` (or None, for the
            programmatic API) selects the in-memory substrate (one process only). The ASGI
            entry refuses None (``_startup``).
        secrets: ``DESKBRIDGE_SECRET`` first, then ``DESKBRIDGE_PREVIOUS_SECRETS``
            (comma-separated) still accepted during a rotation window.
        api_keys: ``DESKBRIDGE_API_KEY`` (comma-separated for rotation); empty means the
            dispatch API is open, which is allowed on loopback binds only.
        timings: every timing knob (``DESKBRIDGE_<NAME>``), see deskbridge_common.Timings.
        max_inflight_per_session: most jobs delivered and not yet answered on one socket
            (``DESKBRIDGE_MAX_INFLIGHT``, default 32).
        max_args_bytes: largest JSON-encoded ``args`` accepted by the dispatch API
            (``DESKBRIDGE_MAX_ARGS_BYTES``, default 256 KiB, at most
            ``MAX_ARGS_BYTES_LIMIT``: what a job frame can carry).
        token_leeway_s: clock skew tolerated on a sidecar token's ``iat`` and ``exp``
            (``DESKBRIDGE_TOKEN_LEEWAY_S``, seconds in [0, 3600], default 300; see
            docs/operations.md, "Clocks").
        redis_max_connections: most Redis connections the process holds at once
            (``DESKBRIDGE_REDIS_MAX_CONNECTIONS``, default 16, at least 3; see
            docs/operations.md, "Redis requirements").
        max_calls: most dispatch calls (HTTP, MCP, status) in flight in the process at
            once; more are refused at once with 503 ``overloaded`` (``DESKBRIDGE_MAX_CALLS``,
            default 5,000: what waiting calls hold, memory and descriptors;
            ``_admission.DEFAULT_MAX_CALLS`` says where it comes from).
        shed_lag_s: refuse new dispatch calls (503 ``overloaded``) while the process's
            event loop lags more than this, seconds (``DESKBRIDGE_SHED_LAG_S``, default
            0.25, in [0, 60]; 0 turns the lag gate off).
    """

    redis_url: str | None = None
    secrets: tuple[str, ...] = ()
    api_keys: tuple[str, ...] = ()
    timings: Timings = attrs.field(factory=Timings)
    max_inflight_per_session: int = 32
    max_args_bytes: int = DEFAULT_MAX_ARGS_BYTES
    token_leeway_s: float = TOKEN_LEEWAY_S
    redis_max_connections: int = 16
    max_calls: int = DEFAULT_MAX_CALLS
    shed_lag_s: float = DEFAULT_SHED_LAG_S

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> HubConfig:
        """Read the configuration from ``environ`` (default ``os.environ``).

        Raises:
            ValueError: a variable does not parse (``DESKBRIDGE_REDIS_URL`` included:
                :func:`redis_url_problem`); the message names it.
        """
        env = os.environ if environ is None else environ

        def csv(name: str) -> tuple[str, ...]:
            return tuple(p.strip() for p in env.get(name, "").split(",") if p.strip())

        secret = env.get("DESKBRIDGE_SECRET", "").strip()
        return cls(
            redis_url=_redis_url(env),
            secrets=((secret,) if secret else ()) + csv("DESKBRIDGE_PREVIOUS_SECRETS"),
            api_keys=csv("DESKBRIDGE_API_KEY"),
            timings=Timings.from_env(env),
            max_inflight_per_session=_int(
                env, "DESKBRIDGE_MAX_INFLIGHT", 32, most=MAX_INFLIGHT_LIMIT
            ),
            max_args_bytes=max_args_bytes(env),
            token_leeway_s=_seconds(
                env, "DESKBRIDGE_TOKEN_LEEWAY_S", TOKEN_LEEWAY_S, most=MAX_TOKEN_LEEWAY_S
            ),
            redis_max_connections=_redis_max_connections(env),
            max_calls=_int(env, "DESKBRIDGE_MAX_CALLS", DEFAULT_MAX_CALLS, most=MAX_CALLS_LIMIT),
            shed_lag_s=_seconds(
                env, "DESKBRIDGE_SHED_LAG_S", DEFAULT_SHED_LAG_S, most=MAX_SHED_LAG_S
            ),
        )


def max_args_bytes(env: Mapping[str, str]) -> int:
    """``DESKBRIDGE_MAX_ARGS_BYTES`` of ``env``: bytes in [1, ``MAX_ARGS_BYTES_LIMIT``],
    default 256 KiB (also what ``deskbridge-hub call`` checks ``--args`` against).

    Raises:
        ValueError: not an integer, or out of range (the message names the variable).
    """
    return _int(env, "DESKBRIDGE_MAX_ARGS_BYTES", DEFAULT_MAX_ARGS_BYTES, most=MAX_ARGS_BYTES_LIMIT)


def _int(env: Mapping[str, str], name: str, default: int, *, most: int, least: int = 1) -> int:
    raw = env.get(name)
    if raw is None:
        return default
    accepted = f"an integer in [{least}, {most}]"
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer; it must be {accepted}") from None
    if not least <= value <= most:
        raise ValueError(f"{name} must be {accepted}, got {raw!r}")
    return value


def _seconds(env: Mapping[str, str], name: str, default: float, *, most: float) -> float:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from None
    if not (math.isfinite(value) and 0 <= value <= most):
        raise ValueError(f"{name} must be a number of seconds in [0, {most:g}], got {raw!r}")
    return value


def _redis_url(env: Mapping[str, str]) -> str | None:
    url = env.get("DESKBRIDGE_REDIS_URL") or None
    problem = None if url in (None, MEMORY_URL) else redis_url_problem(url)
    if problem:
        raise ValueError(problem)
    return url


def _redis_max_connections(env: Mapping[str, str]) -> int:
    # at least 3: one shared, one for blocking commands, one pub/sub
    return _int(
        env, "DESKBRIDGE_REDIS_MAX_CONNECTIONS", 16, least=3, most=MAX_REDIS_CONNECTIONS_LIMIT
    )


def redis_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a Redis URL, or None. Checked before anything connects, by
    ``deskbridge-hub serve`` and by the bare ASGI entry (``_startup``): Hypercorn's
    lifespan would turn a bad port or DB into a traceback (or ignore a DB that is not a
    number). The message never contains the URL (it may hold a password).

    Args:
        url: a ``DESKBRIDGE_REDIS_URL`` other than ``memory://``.

    Returns:
        One sentence naming what is wrong, or None when the URL is well formed (whether
        Redis has that database is learnt only when connecting).
    """
    shape = (
        "DESKBRIDGE_REDIS_URL must look like redis://HOST:PORT/DB (or rediss://, "
        "unix://, memory://, redis+cluster://HOST:PORT,HOST:PORT)"
    )
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as exc:  # e.g. an unclosed [ of an IPv6 address
        return f"{shape}: {exc}"
    schemes = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")
    if parts.scheme not in schemes or (parts.scheme != "unix" and not parts.hostname):
        return shape
    if parts.scheme == "unix":
        options = query_problem(parts.scheme, parts.query)
        return f"DESKBRIDGE_REDIS_URL: {options}" if options else None
    hosts = parts.netloc.rpartition("@")[2]
    for host in hosts.split(",") if parts.scheme.endswith("+cluster") else [hosts]:
        port = host.rpartition("]")[2].rpartition(":")[2] if ":" in host else ""
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            return f"{shape}: port {port!r} is not a number in 1-65535"
    db = parts.path.strip("/")
    if db and not db.isdigit():
        return f"{shape}: database {db!r} is not a number"
    options = query_problem(parts.scheme, parts.query)
    return f"DESKBRIDGE_REDIS_URL: {options}" if options else None
