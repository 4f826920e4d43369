"""The sidecar's version, as announced in ``hello`` and ``status``."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("deskbridge-sidecar")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.1.0"

__all__ = ["__version__"]
