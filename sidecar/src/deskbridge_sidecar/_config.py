"""The sidecar's configuration file, token store and file locations (a desktop service).

Config: TOML (read with ``tomllib``) at ``--config PATH``, ``$DESKBRIDGE_CONFIG``, or
``sidecar.toml`` in the platform's user config directory (``platformdirs``: e.g.
``~/.config/deskbridge/`` on Linux, ``~/Library/Application Support/deskbridge/`` on
macOS). Keys, all optional; command-line flags and environment variables win::

    hub = "wss://hub.example"          # --hub / DESKBRIDGE_HUB_URL
    tools = ["my_tools"]               # --tools (added to the command line's)
    ca_file = "/etc/ssl/my-ca.pem"     # --ca-file
    log_file = "~/deskbridge.log"      # rotating log file (default: the platform's log dir)
    data_dir = "~/deskbridge-data"     # --data-dir / DESKBRIDGE_DATA_DIR

The token is never in the config file: ``deskbridge-sidecar set-token`` stores it in the OS
keyring (``keyring``: Secret Service, macOS Keychain, Windows Credential Locker) or, when no
keyring backend is usable, in ``token`` beside the config file with permissions 0600.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import math
import os
import re
import time
import tomllib
from pathlib import Path
from typing import Any

import attrs
import platformdirs

APP = "deskbridge"
KEYRING_SERVICE = "deskbridge-sidecar"
KEYRING_USER = "token"
KEYS = {"hub": str, "tools": list, "ca_file": str, "log_file": str, "data_dir": str}


class ConfigError(ValueError):
    """The config file cannot be read or has a wrong key or type (the message says which)."""


def config_dir() -> Path:
    return Path(platformdirs.user_config_dir(APP, appauthor=False))


def default_config_path() -> Path:
    env = os.environ.get("DESKBRIDGE_CONFIG")
    return Path(env).expanduser() if env else config_dir() / "sidecar.toml"


def default_log_file() -> Path:
    return Path(platformdirs.user_log_dir(APP, appauthor=False)) / "sidecar.log"


@attrs.frozen
class SidecarConfig:
    """The config file's settings (None: not set)."""

    path: Path | None = None
    hub: str | None = None
    tools: tuple[str, ...] = ()
    ca_file: str | None = None
    log_file: str | None = None
    data_dir: str | None = None


def load_config(path: Path | None = None, *, required: bool = False) -> SidecarConfig:
    """Read the config file (``path`` or :func:`default_config_path`).

    Args:
        required: a missing file is an error (it was named explicitly).

    Raises:
        ConfigError: unreadable, not TOML, an unknown key or a wrong type.
    """
    named_by = ""
    if path is None and os.environ.get("DESKBRIDGE_CONFIG"):
        # named on purpose, as --config does: a typo'd path was ignored without a word
        required, named_by = True, "DESKBRIDGE_CONFIG: "
    path = path or default_config_path()
    try:
        with open(path, "rb") as f:
            data: dict[str, Any] = tomllib.load(f)
    except FileNotFoundError:
        if required:
            raise ConfigError(f"{named_by}{path}: no such file") from None
        return SidecarConfig()
    except UnicodeDecodeError:  # tomllib decodes UTF-8 itself: was a traceback, exit 1
        raise ConfigError(f"{path}: not UTF-8 text (TOML is UTF-8)") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    for key, value in data.items():
        if key not in KEYS:
            raise ConfigError(f"{path}: unknown key {key!r} (known: {', '.join(KEYS)})")
        if not isinstance(value, KEYS[key]):
            kind = "a list of module names" if key == "tools" else "a string"
            raise ConfigError(f"{path}: {key} must be {kind}, got {value!r}")
    tools = data.get("tools", [])
    if not all(isinstance(t, str) for t in tools):
        raise ConfigError(f"{path}: tools must be a list of module names, got {tools!r}")

    def expanded(key: str) -> str | None:
        value = data.get(key)
        return str(Path(value).expanduser()) if value else None

    return SidecarConfig(
        path=path,
        hub=data.get("hub"),
        tools=tuple(tools),
        ca_file=expanded("ca_file"),
        log_file=expanded("log_file"),
        data_dir=expanded("data_dir"),
    )


# -- token storage ---------------------------------------------------------------------


def token_file() -> Path:
    return config_dir() / "token"


def _keyring() -> Any | None:
    """The keyring module, or None when it is disabled or not installed. A backend that
    cannot store anything (no Secret Service on a headless Linux) raises on use, and the
    callers fall back to the file."""
    if os.environ.get("DESKBRIDGE_NO_KEYRING"):
        return None
    try:
        import keyring
    except ImportError:
        return None
    return keyring


#: Clock skew the hub tolerates on a token's ``exp`` (its ``TOKEN_LEEWAY_S``), seconds.
TOKEN_LEEWAY_S = 300.0
_BASE64URL = re.compile(r"[A-Za-z0-9_-]+")


@attrs.frozen
class TokenClaims:
    """What a sidecar token says about itself (read, not verified: only the hub holds the
    secret that signs it)."""

    user_id: str
    expires_at: float


def check_token(token: str, *, now: float | None = None) -> TokenClaims:
    """Check that ``token`` looks like a sidecar token from ``deskbridge-hub token
    USER_ID``: a compact JWT (three base64url parts separated by dots) whose header and
    payload are JSON objects, the header naming its ``alg``, the payload holding a
    non-empty string ``sub`` (the user id) and a numeric ``exp`` not already past (with
    the hub's leeway, :data:`TOKEN_LEEWAY_S`). The signature is not verified: the sidecar
    has no secret; the hub does that when the sidecar connects.

    Raises:
        ValueError: why it is not one (the message never contains the token).
    """
    parts = token.split(".")
    if len(parts) != 3 or not all(_BASE64URL.fullmatch(p) for p in parts):
        raise ValueError(
            "not a sidecar token: expected a JWT, three base64url parts separated by dots "
            "(copy the whole output of `deskbridge-hub token USER_ID`)"
        )
    decoded = []
    for name, part in (("header", parts[0]), ("payload", parts[1])):
        try:
            raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
            value = json.loads(raw)
        except (ValueError, binascii.Error):
            value = None
        if not isinstance(value, dict):
            raise ValueError(f"not a sidecar token: its {name} is not a base64url JSON object")
        decoded.append(value)
    header, payload = decoded
    if not isinstance(header.get("alg"), str):
        raise ValueError("not a sidecar token: its header names no alg")
    sub, exp = payload.get("sub"), payload.get("exp")
    if not isinstance(sub, str) or not sub:
        raise ValueError("not a sidecar token: no user id (sub claim)")
    if isinstance(exp, bool) or not isinstance(exp, int | float) or not math.isfinite(exp):
        raise ValueError("not a sidecar token: no expiry (exp claim)")
    current = time.time() if now is None else now
    if exp + TOKEN_LEEWAY_S < current:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(exp))
        raise ValueError(
            f"the token of user {sub!r} expired at {when}: issue a new one with "
            f"`deskbridge-hub token {sub}`"
        )
    return TokenClaims(user_id=sub, expires_at=float(exp))


def store_token(token: str) -> str:
    """Store ``token``; returns where ("the OS keyring" or the file path)."""
    kr = _keyring()
    if kr is not None:
        try:
            kr.set_password(KEYRING_SERVICE, KEYRING_USER, token)
            return "the OS keyring"
        except Exception:  # noqa: BLE001 - locked or refusing keyring: fall back to the file
            pass
    path = token_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.chmod(path, 0o600)  # also when the file existed with wider permissions
    return str(path)


def load_token() -> str | None:
    """The stored token (keyring first, then the 0600 file), or None."""
    kr = _keyring()
    if kr is not None:
        with contextlib.suppress(Exception):
            token = kr.get_password(KEYRING_SERVICE, KEYRING_USER)
            if token:
                return str(token)
    try:
        path = token_file()
        if path.stat().st_mode & 0o077:
            raise ConfigError(f"{path} is readable by others: chmod 600 {path}")
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None
