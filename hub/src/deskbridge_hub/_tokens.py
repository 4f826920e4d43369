"""Sidecar tokens: HS256 JWTs signed with ``DESKBRIDGE_SECRET`` by PyJWT.

Claims: ``sub`` (user id), ``iat``, ``exp`` (Unix seconds), header ``kid`` = the first 16
hex digits of SHA-256 of the signing secret, so a hub holding several secrets (rotation)
knows which one to verify with without trying them all.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence

import jwt

from ._validate import validate_user_id

ALGORITHM = "HS256"
#: Default token lifetime: 30 days, in seconds.
DEFAULT_TOKEN_LIFETIME_S = 30 * 24 * 3600.0


class TokenRejected(Exception):
    """The token is missing, malformed, forged, expired or signed with an unknown key."""


def key_id(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()[:16]


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
        lifetime_s: seconds until expiry.
        now: issue time, Unix seconds (default: the wall clock).

    Raises:
        ValueError: empty secret, invalid user id or non-positive lifetime.
    """
    if not secret:
        raise ValueError("DESKBRIDGE_SECRET is empty: set it to sign tokens")
    if lifetime_s <= 0:
        raise ValueError("lifetime_s must be positive")
    validate_user_id(user_id)
    issued = time.time() if now is None else now
    claims = {"sub": user_id, "iat": int(issued), "exp": int(issued + lifetime_s)}
    return jwt.encode(claims, secret, algorithm=ALGORITHM, headers={"kid": key_id(secret)})


def verify_token(token: str, secrets: Sequence[str]) -> str:
    """Verify a sidecar token and return its user id.

    Args:
        token: the compact JWT.
        secrets: every secret currently accepted (current first, then those being
            rotated out).

    Raises:
        TokenRejected: malformed, unknown ``kid``, bad signature, expired, or a ``sub``
            that is not a valid user id.
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
        claims = jwt.decode(
            token, secret, algorithms=[ALGORITHM], options={"require": ["sub", "exp"]}
        )
    except jwt.ExpiredSignatureError:
        raise TokenRejected("token expired") from None
    except jwt.PyJWTError as exc:
        raise TokenRejected(f"invalid token: {exc}") from None
    user_id = claims["sub"]
    try:
        validate_user_id(user_id)
    except ValueError as exc:
        raise TokenRejected(str(exc)) from None
    return user_id
