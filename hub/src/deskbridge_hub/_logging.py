"""Log setup for hub processes: one line per record, level from DESKBRIDGE_LOG_LEVEL."""

from __future__ import annotations

import logging
import os


def setup_logging(level: str | None = None) -> None:
    level = level or os.environ.get("DESKBRIDGE_LOG_LEVEL", "INFO")
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s",
    )
    # coredis logs a traceback at ERROR when a connection attempt is cancelled (shutdown,
    # a cancelled blocking read); the substrate maps every real failure itself.
    logging.getLogger("coredis").setLevel(logging.CRITICAL)
