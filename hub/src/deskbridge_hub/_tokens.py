"""Sidecar tokens: HS256 JWTs signed with ``DESKBRIDGE_SECRET`` by PyJWT.

Claims: ``sub`` (user id), ``iat``, ``exp`` (Unix seconds), header ``kid`` = the first 16
hex digits of SHA-256 of the signing secret, so a hub holding several secrets (rotation)
knows which one to verify with without trying them all.

Clock skew (docs/operations.md, "Clocks"): a token is usually minted on another machine
(``deskbridge-hub token`` on an operator's laptop, a provisioning service) than the hub that
verifies it, so ``iat`` and ``exp`` are compared with a leeway of ``TOKEN_LEEWAY_S`` (5 min,
the default clock skew tolerated by Kerberos and by .NET's JWT validation): a token minted
on a clock up to 5 min ahead is valid at once, and every token stays valid 5 min past its
``exp`` by the hub's clock. A token whose ``iat`` is further ahead is refused with
:class:`TokenNotYetValid`, a refusal that will go away by itself (the hub answers 503 and
the sidecar retries), never a final one.

Secrets must be at least 32 bytes (256 bits, RFC 7518 section 3.2: an HS256 key no
shorter than the hash output); a shorter one is refused when issuing and never used to
verify.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Sequence

import attrs
import jwt

from ._validate import validate_user_id

ALGORITHM = "HS256"
#: Shortest accepted secret, in bytes of UTF-8 (RFC 7518 section 3.2).
MIN_SECRET_BYTES = 32
#: Default token lifetime: 30 days, in seconds.
DEFAULT_TOKEN_LIFETIME_S = 30 * 24 * 3600.0
#: Clock skew tolerated between the machine that minted a token and the hub: 300 s (the
#: default of Kerberos and of .NET's JWT validation). ``DESKBRIDGE_TOKEN_LEEWAY_S``.
TOKEN_LEEWAY_S = 300.0
#: Largest leeway, seconds: an hour. The leeway also accepts a token that long after its
#: ``exp``; skew beyond it is a broken clock, not drift (``DESKBRIDGE_TOKEN_LEEWAY_S`` and
#: ``verify_token(leeway_s=)`` alike).
MAX_TOKEN_LEEWAY_S = 3600.0


class TokenRejected(Exception):
    """The token is missing, malformed, forged, expired or signed with an unknown key.

    The hub refuses the WebSocket handshake with HTTP 403 (or 401 for
    :class:`TokenExpired`); the message is for the hub's log, never trusted input.
    """


class TokenExpired(TokenRejected):
    """The token was genuine but its ``exp`` has passed (HTTP 401: issue a new one)."""


class TokenNotYetValid(TokenRejected):
    """The token is genuine but was issued (``iat``) more than the leeway ahead of the
    hub's clock: the minting machine's clock runs ahead. Transient: it becomes valid by
    itself; the hub answers 503 with ``Retry-After`` so the sidecar keeps retrying.

    Attributes:
        valid_in_s: seconds until the hub will accept it.
    """

    def __init__(self, message: str, *, valid_in_s: float):
        super().__init__(message)
        self.valid_in_s = valid_in_s


# Verification never silently uses a short key: PyJWT raises instead of warning.
_JWT = jwt.PyJWT(options={"enforce_minimum_key_length": True})


#: The refusal of a token whose header has no ``kid`` (or an empty one): what the hub
#: expects there, and what sets it.
NO_KID = (
    "token has no kid header: the hub picks the secret to verify with by kid, the first 16 "
    "hex digits of the SHA-256 of the signing secret (deskbridge-hub token and issue_token "
    "set it; docs/security.md)"
)


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


def verify_token(token: str, secrets: Sequence[str], *, leeway_s: float = TOKEN_LEEWAY_S) -> str:
    """Verify a sidecar token and return its user id (see :func:`verify_token_claims`)."""
    return verify_token_claims(token, secrets, leeway_s=leeway_s)[0]


@attrs.frozen
class TokenClaims:
    """What a verified token says (:func:`verify_claims`).

    Attributes:
        user_id: its ``sub``.
        valid_until: ``exp + leeway_s``, Unix seconds: after it this hub refuses the
            token (a session using it is closed then, 4003).
        issued_at: its ``iat``, Unix seconds, or None when it has none (a token minted
            elsewhere): a revocation of the user (``_revocation``) refuses it then.
    """

    user_id: str
    valid_until: float
    issued_at: float | None


def verify_token_claims(
    token: str,
    secrets: Sequence[str],
    *,
    leeway_s: float = TOKEN_LEEWAY_S,
    now: float | None = None,
) -> tuple[str, float]:
    """Verify a sidecar token and return ``(user_id, valid_until)`` (see
    :func:`verify_claims`, which raises the same)."""
    claims = verify_claims(token, secrets, leeway_s=leeway_s, now=now)
    return claims.user_id, claims.valid_until


def verify_claims(
    token: str,
    secrets: Sequence[str],
    *,
    leeway_s: float = TOKEN_LEEWAY_S,
    now: float | None = None,
) -> TokenClaims:
    """Verify a sidecar token and return what it says.

    Args:
        token: the compact JWT.
        secrets: every secret currently accepted (current first, then those being
            rotated out).
        leeway_s: clock skew tolerated on ``iat`` and ``exp``, seconds in [0,
            ``MAX_TOKEN_LEEWAY_S`` = 3600] (default ``TOKEN_LEEWAY_S`` = 300 s).
        now: the hub's time, Unix seconds (default: the wall clock).

    Returns:
        The user id, ``exp + leeway_s`` in Unix seconds (the instant after which this
        hub no longer accepts the token: a session using it is closed then, so a closed
        sidecar is not let back in with the same token), and ``iat`` if it has one.

    Raises:
        TokenExpired: signature good, ``exp`` more than ``leeway_s`` in the past.
        TokenNotYetValid: signature good, ``iat`` more than ``leeway_s`` in the future
            (the minting machine's clock is ahead; transient).
        TokenRejected: malformed, ``alg`` other than HS256 (``none`` included), no
            ``kid`` (:data:`NO_KID`) or an unknown one, bad signature, ``sub`` or
            ``exp`` missing, or a ``sub`` that is not a valid user id.
    """
    # the bound DESKBRIDGE_TOKEN_LEEWAY_S has: a leeway of 1e12 s accepted a token expired
    # 30,000 years ago when given from Python
    if not (math.isfinite(leeway_s) and 0 <= leeway_s <= MAX_TOKEN_LEEWAY_S):
        raise ValueError(
            f"leeway_s must be a number of seconds in [0, {MAX_TOKEN_LEEWAY_S:g}], got {leeway_s!r}"
        )
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise TokenRejected(f"malformed token: {exc}") from None
    if not header.get("kid"):  # "unknown key" sent the operator looking for a wrong secret
        raise TokenRejected(NO_KID)
    by_kid = {key_id(s): s for s in secrets if s}
    secret = by_kid.get(str(header.get("kid")))
    if secret is None:
        raise TokenRejected("token signed with an unknown key")
    # PyJWT compares with its own clock; checking iat/exp here on ``now`` keeps one rule
    # for both (and lets tests move the hub's clock).
    try:
        claims = _JWT.decode(
            token,
            secret,
            algorithms=[ALGORITHM],
            leeway=leeway_s,  # for an ``nbf`` claim, if a minting service adds one
            options={"require": ["sub", "exp"], "verify_exp": False, "verify_iat": False},
        )
    except jwt.PyJWTError as exc:
        raise TokenRejected(f"invalid token: {exc}") from None
    hub_now = time.time() if now is None else now
    exp, iat = claims["exp"], claims.get("iat")
    for name, value in (("exp", exp), ("iat", iat)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise TokenRejected(f"invalid token: {name} is not a number")
    valid_until = float(exp) + leeway_s
    if hub_now >= valid_until:
        raise TokenExpired(
            f"token expired {hub_now - float(exp):.0f} s ago (leeway {leeway_s:g} s)"
        )
    if iat is not None and float(iat) > hub_now + leeway_s:
        ahead_s = float(iat) - hub_now
        raise TokenNotYetValid(
            f"token issued {ahead_s:.0f} s in the future by this hub's clock, more than the "
            f"{leeway_s:g} s leeway: the clock of the machine that minted it runs ahead",
            valid_in_s=ahead_s - leeway_s,
        )
    user_id = claims["sub"]
    try:
        validate_user_id(user_id)
    except ValueError as exc:
        raise TokenRejected(str(exc)) from None
    return TokenClaims(user_id, valid_until, None if iat is None else float(iat))
