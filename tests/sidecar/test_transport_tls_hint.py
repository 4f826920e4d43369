"""A newcomer pass: ``--hub wss://`` at a hub serving plain ws:// retried with "TLS
handshake with HOST:PORT failed: [SSL: WRONG_VERSION_NUMBER] wrong version number", which
says nothing a person can act on; the line now says the hub does not speak TLS."""

from __future__ import annotations

import functools

import pytest
import trio
from deskbridge_sidecar._errors import ConnectFailed
from deskbridge_sidecar._transport import WebSocketConnector


async def test_wss_at_a_plain_hub_says_to_use_ws() -> None:
    async def plain_http(stream: trio.SocketStream) -> None:  # answers as Hypercorn would
        await stream.receive_some(4096)
        await stream.send_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_tcp, plain_http, 0, host="127.0.0.1")
        (listener,) = await nursery.start(serve)
        port = listener.socket.getsockname()[1]
        with trio.fail_after(10), pytest.raises(ConnectFailed) as info:
            await WebSocketConnector()._open_stream(
                "127.0.0.1", port, True, trio.current_time() + 5
            )
        nursery.cancel_scope.cancel()
    message = str(info.value)
    assert message.startswith(f"TLS handshake with 127.0.0.1:{port} failed"), message
    assert message.endswith(
        "; the hub does not speak TLS there: use ws:// (or serve it with --certfile/--keyfile)"
    ), message
