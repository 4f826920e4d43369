"""ASGI entry for Hypercorn: ``hypercorn -k trio deskbridge_hub.asgi:app``.

Configuration comes from the environment (``DESKBRIDGE_REDIS_URL``,
``DESKBRIDGE_SECRET``, ``DESKBRIDGE_API_KEY``, ``DESKBRIDGE_<TIMING>``); see
``_startup`` for what is refused at import (one line on stderr, exit status 2).
"""

from ._app import create_app
from ._envcheck import warn_unknown_variables
from ._logging import setup_logging
from ._startup import load_config

setup_logging()
warn_unknown_variables()
app = create_app(load_config(), handle_sigterm=True)
