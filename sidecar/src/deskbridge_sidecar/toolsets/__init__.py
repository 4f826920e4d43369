"""Ready-made toolsets, opt-in by configuration (nothing here is offered by default).

- :class:`FilesToolset` (``files_list``, ``files_read``, ``files_write``): confined to
  configured roots. ``deskbridge-sidecar run --files-root PATH`` (repeatable).
- :class:`BrowserToolset` (``browser_open``, ``browser_text``, ``browser_click``,
  ``browser_fill``, ``browser_wait_for``, ``browser_screenshot``, ``browser_tabs``,
  ``browser_close_tab``): Playwright driving the installed Chrome/Chromium over a
  persistent profile, allowed origins only. ``deskbridge-sidecar run --browser-origin
  ORIGIN`` (repeatable). Needs the ``browser`` extra (``deskbridge-sidecar[browser]``).

Embedding::

    files = FilesToolset(["~/Documents/invoices"])
    browser = BrowserToolset(["https://portal.example.com"], headless=True)
    registry = ToolRegistry([*files.tools(), *browser.tools()])
    ...
    browser.close()   # after the daemon stopped
"""

from .browser import BrowserToolset, OriginPolicy
from .files import FilesToolset

__all__ = ["BrowserToolset", "FilesToolset", "OriginPolicy"]
