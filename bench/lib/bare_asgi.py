"""The floors under the hub's figures: Hypercorn's trio worker serving an ASGI app that
reads an HTTP request's body and answers a fixed JSON body at once, and echoes every
WebSocket text message back (no routing, no middleware, no Redis). ``bench/compare.py``
measures its CPU per HTTP request and per WebSocket round trip in the same run, so "HTTP
adds N ms of hub CPU" and the hub's CPU per call (one job frame out, one result frame in)
can be read against what Hypercorn itself costs on this machine.

Usage: python bench/lib/bare_asgi.py PORT
"""

from __future__ import annotations

import sys
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

BODY = b'{"status":"completed","result":{}}'


async def app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "websocket":  # accept, then echo every text message back
        while True:
            message = await receive()
            if message["type"] == "websocket.connect":
                await send({"type": "websocket.accept"})
            elif message["type"] == "websocket.receive":
                await send({"type": "websocket.send", "text": message.get("text") or ""})
            else:
                return
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    while (await receive()).get("more_body"):
        pass
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(BODY))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": BODY})


def main() -> None:
    config = Config()
    config.bind = [f"127.0.0.1:{int(sys.argv[1])}"]
    config.accesslog = None
    trio.run(serve, app, config)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
