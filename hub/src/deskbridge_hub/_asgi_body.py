"""Reading a request body from ASGI ``receive`` with Quart's bounds, for the routes served
in front of Quart (the job route ``_jobs_asgi``, the MCP endpoint ``_mcp_mount``): the
same limits as Quart's own routes, so no way in holds a task and a descriptor for ever.

- size: ``MAX_CONTENT_LENGTH`` bytes, by the declared ``Content-Length`` (refused before
  a byte of the body is read) and by what arrives (chunked, or more than declared);
- time: ``BODY_TIMEOUT`` seconds for the whole body (a client that declares a length and
  sends less, or drips it, is refused then).
"""

from __future__ import annotations

import math
from typing import Any

import trio
from werkzeug.exceptions import RequestEntityTooLarge, RequestTimeout
from werkzeug.sansio.utils import get_content_length

#: Bytes of a refused body read and dropped before the 413 is sent, and for how long
#: (seconds): closing a connection whose client is still sending resets it (TCP RST)
#: before the client reads the answer, so an SDK saw a read error instead of the 413
#: naming the limit (nginx's "lingering close" for the same reason). A body larger than
#: this, or slower, still gets the 413 at the bound (the client may then see a reset).
DRAIN_BYTES = 16 * 1024 * 1024
DRAIN_S = 1.0


async def read_body(receive: Any, headers: dict[str, str], quart: Any) -> bytes | None:
    """The whole body, or None if the client went away first.

    Args:
        receive: the request's ASGI ``receive``.
        headers: the request's headers, lower-case names (``content-length``,
            ``transfer-encoding``).
        quart: the app's config: ``MAX_CONTENT_LENGTH`` (bytes) and ``BODY_TIMEOUT``
            (seconds), each None for no limit, read per request.

    Raises:
        RequestEntityTooLarge: ``Content-Length`` or the bytes received exceed
            ``MAX_CONTENT_LENGTH`` (after what arrives within ``DRAIN_S``, up to
            ``DRAIN_BYTES``, was read and dropped, so the client can read the answer).
        RequestTimeout: the body took longer than ``BODY_TIMEOUT`` seconds.
    """
    limit = quart["MAX_CONTENT_LENGTH"]
    expected = get_content_length(headers.get("content-length"), headers.get("transfer-encoding"))
    if limit is not None and expected is not None and expected > limit:
        await _drain(receive, 0)
        raise RequestEntityTooLarge()
    body = bytearray()
    timeout = quart["BODY_TIMEOUT"]
    with trio.move_on_after(math.inf if timeout is None else timeout):
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            if message["type"] != "http.request":
                continue
            body += message.get("body", b"")
            if limit is not None and len(body) > limit:
                if message.get("more_body", False):
                    await _drain(receive, len(body))
                raise RequestEntityTooLarge()
            if not message.get("more_body", False):
                return bytes(body)
    raise RequestTimeout()


async def _drain(receive: Any, read: int) -> None:
    """Read and drop the rest of a refused body: until it ends, the client goes away,
    ``DRAIN_BYTES`` in all were read (``read`` already), or ``DRAIN_S`` passed."""
    with trio.move_on_after(DRAIN_S):
        while read < DRAIN_BYTES:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            if message["type"] != "http.request":
                continue
            read += len(message.get("body", b""))
            if not message.get("more_body", False):
                return


__all__ = ["read_body"]
