"""Sidecar tokens: HS256 JWTs signed with ``DESKBRIDGE_SECRET`` by PyJWT.

Claims: ``sub`` (user id), ``iat``, ``exp`` (Unix seconds), header ``kid`` = the first 16
hex digits of SHA-256 of the signing secret, so a hub holding several secrets (rotation)
knows which one to verify with without trying them all.

Secrets must be at least 32 bytes (256 bits, RFC 7518 section 3.2: an HS256 key no
shorter than the hash output); a shorter one is refused when issuing and never used to
verify.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Sequence

import jwt

from ._validate import validate_user_id

ALGORITHM = "HS256"
#: Shortest accepted secret, in bytes of UTF-8 (RFC 7518 section 3.2).
MIN_SECRET_BYTES = 32
#: Default token lifetime: 30 days, in seconds.
DEFAULT_TOKEN_LIFETIME_S = 30 * 24 * 3600.0


class TokenRejected(Exception):
    """The token is missing, malformed, forged, expired or signed with an unknown key.

    The hub refuses the WebSocket handshake with HTTP 403 (or 401 for
    :class:`TokenExpired`); the message is for the hub's log, never trusted input.
    """


class TokenExpired(TokenRejected):
    """The token was genuine but its ``exp`` has passed (HTTP 401: issue a new one)."""


# Verification never silently uses a short key: PyJWT raises instead of warning.
_JWT = jwt.PyJWT(options={"enforce_minimum_key_length": True})


def key_id(secret: str) -> str:
    """The ``kid`` header for ``secret``: the first 16 hex digits of its SHA-256."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()[:16]


def check_secret(secret: str, name: str = "DESKBRIDGE_SECRET") -> str:
    """Return ``secret`` if it is usable for HS256.

    Raises:
        ValueError: empty, or shorter than ``MIN_SECRET_BYTES`` bytes (the message
            names ``name`` and never contains the secret).
    """
    if not secret:
        raise ValueError(f"{name} is empty: set it to sign tokens")
    size = len(secret.encode("utf-8"))
    if size < MIN_SECRET_BYTES:
        raise ValueError(
            f"{name} is {size} bytes; it must be at least {MIN_SECRET_BYTES} "
            "(e.g. python3 -c 'import secrets; print(secrets.token_hex(32))')"
        )
    return secret


def issue_token(
    secret: str,
    user_id: str,
    *,
    lifetime_s: float = DEFAULT_TOKEN_LIFETIME_S,
    now: float | None = None,
) -> str:
    """Sign a sidecar token for ``user_id``.

    Args:
        secret: the signing secret (``DESKBRIDGE_SECRET``), non-empty.
        user_id: the user the token speaks for (validated, see ``validate_user_id``).
        lifetime_s: seconds until expiry (positive, finite).
        now: issue time, Unix seconds (default: the wall clock).

    Raises:
        ValueError: empty or short secret (see ``check_secret``), invalid user id or a
            non-positive lifetime.
    """
    check_secret(secret)
    if not (math.isfinite(lifetime_s) and lifetime_s > 0):
        raise ValueError("lifetime_s must be a positive, finite number of seconds")
    validate_user_id(user_id)
    issued = time.time() if now is None else now
    claims = {"sub": user_id, "iat": int(issued), "exp": int(issued + lifetime_s)}
    return jwt.encode(claims, secret, algorithm=ALGORITHM, headers={"kid": key_id(secret)})


def verify_token(token: str, secrets: Sequence[str]) -> str:
    """Verify a sidecar token and return its user id (see :func:`verify_token_claims`)."""
    return verify_token_claims(token, secrets)[0]


def verify_token_claims(token: str, secrets: Sequence[str]) -> tuple[str, float]:
    """Verify a sidecar token and return ``(user_id, exp)``, ``exp`` in Unix seconds.

    Args:
        token: the compact JWT.
        secrets: every secret currently accepted (current first, then those being
            rotated out).

    Raises:
        TokenExpired: signature good, ``exp`` in the past.
        TokenRejected: malformed, ``alg`` other than HS256 (``none`` included), unknown
            ``kid``, bad signature, ``sub`` or ``exp`` missing, or a ``sub`` that is not a
            valid user id.
    """
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise TokenRejected(f"malformed token: {exc}") from None
    by_kid = {key_id(s): s for s in secrets if s}
    secret = by_kid.get(str(header.get("kid")))
    if secret is None:
        raise TokenRejected("token signed with an unknown key")
    try:
        claims = _JWT.decode(
            token, secret, algorithms=[ALGORITHM], options={"require": ["sub", "exp"]}
        )
    except jwt.ExpiredSignatureError:
        raise TokenExpired("token expired") from None
    except jwt.PyJWTError as exc:
        raise TokenRejected(f"invalid token: {exc}") from None
    user_id = claims["sub"]
    try:
        validate_user_id(user_id)
    except ValueError as exc:
        raise TokenRejected(str(exc)) from None
    return user_id, float(claims["exp"])
