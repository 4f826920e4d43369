"""The ASGI entry's start-up checks: refuse what cannot work, say once what is odd.

``hypercorn -k trio -w N deskbridge_hub.asgi:app`` imports the app in every worker, so
nothing here can know how many workers share the hub. An absent ``DESKBRIDGE_REDIS_URL``
is therefore refused (each worker would run its own in-memory hub and callers would see
desktops offline at random); ``DESKBRIDGE_REDIS_URL=memory://`` asks for the in-memory
substrate on purpose (``deskbridge-hub serve --workers 1`` sets it, as it knows it runs
one process). A refusal prints one line to stderr and exits with status 2.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping

from deskbridge_common._envnames import misspelling_hint

from ._config import MEMORY_URL, HubConfig
from ._tokens import check_secret

log = logging.getLogger("deskbridge.hub")

NO_REDIS_URL = (
    "DESKBRIDGE_REDIS_URL is not set: every Hypercorn worker would run its own in-memory hub "
    "and callers would see desktops offline at random. Set DESKBRIDGE_REDIS_URL=redis://"
    "HOST:PORT/DB, or DESKBRIDGE_REDIS_URL=memory:// for one process on purpose"
)


def load_config(environ: Mapping[str, str] | None = None) -> HubConfig:
    """Read and vet the hub configuration for the ASGI entry.

    Returns:
        The configuration; problems that do not stop the hub are logged (the missing
        ``DESKBRIDGE_SECRET`` at ERROR, the explicit in-memory substrate at WARNING).

    Raises:
        SystemExit: status 2 after one line on stderr, when the configuration cannot
            work (a variable does not parse; ``DESKBRIDGE_REDIS_URL`` absent).
    """
    try:
        config = HubConfig.from_env(environ)
    except ValueError as exc:
        _refuse(str(exc))
    if config.redis_url is None:
        _refuse(NO_REDIS_URL + misspelling_hint("DESKBRIDGE_REDIS_URL", environ))
    if config.redis_url == MEMORY_URL:
        log.warning(
            "in-memory substrate (DESKBRIDGE_REDIS_URL=memory://): serves this process only; "
            "run one worker"
        )
    _check_secrets(config.secrets)
    if not config.secrets:
        log.error(
            "DESKBRIDGE_SECRET is not set: every sidecar handshake is refused "
            "(503 not_configured) until the hub restarts with it%s",
            misspelling_hint("DESKBRIDGE_SECRET", environ),
        )
    return config


def _check_secrets(secrets: tuple[str, ...]) -> None:
    """Every signing secret at least ``MIN_SECRET_BYTES`` (what ``serve`` checks): a user
    holds a token signed with it, so a short one could be found offline from it."""
    try:
        for i, secret in enumerate(secrets):
            check_secret(secret, "DESKBRIDGE_SECRET" if i == 0 else _PREVIOUS)
    except ValueError as exc:
        _refuse(str(exc))


_PREVIOUS = "a secret in DESKBRIDGE_PREVIOUS_SECRETS"


def _refuse(message: str) -> None:
    print(f"deskbridge-hub: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)
