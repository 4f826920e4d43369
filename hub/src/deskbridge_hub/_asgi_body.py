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
            ``MAX_CONTENT_LENGTH``.
        RequestTimeout: the body took longer than ``BODY_TIMEOUT`` seconds.
    """
    limit = quart["MAX_CONTENT_LENGTH"]
    expected = get_content_length(headers.get("content-length"), headers.get("transfer-encoding"))
    if limit is not None and expected is not None and expected > limit:
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
                raise RequestEntityTooLarge()
            if not message.get("more_body", False):
                return bytes(body)
    raise RequestTimeout()


__all__ = ["read_body"]
