"""ASGI entry for Hypercorn: ``hypercorn -k trio deskbridge_hub.asgi:app``.

Configuration comes from the environment (``DESKBRIDGE_REDIS_URL``,
``DESKBRIDGE_SECRET``, ``DESKBRIDGE_API_KEY``, ``DESKBRIDGE_<TIMING>``).
"""

from ._app import create_app
from ._logging import setup_logging

setup_logging()
app = create_app(handle_sigterm=True)
