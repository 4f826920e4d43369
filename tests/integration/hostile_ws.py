"""A raw WebSocket client that says what a hostile peer says (RFC 6455 framing by hand:
RSV bits, declared lengths, continuation frames), for tests against a real hub process.

Every read is bounded by a socket timeout; nothing here loops without a bound.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import time
import zlib

#: A valid hello with the built-in echo tool only.
HELLO = json.dumps(
    {"type": "hello", "protocol_version": 1, "sidecar_version": "hostile", "tools": []}
)


def connect(port: int, token: str, *, offer_deflate: bool = False) -> tuple[socket.socket, str]:
    """Open ``/v1/sidecar`` with ``token``; returns the socket and the 101 answer's head.

    Raises:
        AssertionError: the answer is not ``101 Switching Protocols``.
    """
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    offer = (
        "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
        if offer_deflate
        else ""
    )
    sock.sendall(
        (
            f"GET /v1/sidecar HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"{offer}Authorization: Bearer {token}\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)  # byte by byte: nothing after the head is consumed
        assert chunk, f"closed during the handshake: {head!r}"
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock, head.decode("latin-1")


def frame(payload: bytes, *, opcode: int = 1, fin: bool = True, rsv1: bool = False) -> bytes:
    """One masked client frame."""
    first = (0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", first, 0x80 | n)
    elif n < 65536:
        head = struct.pack("!BBH", first, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", first, 0x80 | 127, n)
    key = os.urandom(4)
    masked = int.from_bytes(payload, "big") ^ int.from_bytes((key * (n // 4 + 1))[:n], "big")
    return head + key + (masked.to_bytes(n, "big") if n else b"")


def deflated(size: int) -> bytes:
    """A permessage-deflate payload (RFC 7692 7.2.1: tail removed) of ``size`` bytes of
    ``a`` (compresses about 1000:1)."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    step = 1 << 20
    parts = [c.compress(b"a" * min(step, size - done)) for done in range(0, size, step)]
    data = b"".join(parts) + c.flush(zlib.Z_SYNC_FLUSH)
    return data[:-4]


def read_until_close(sock: socket.socket, timeout_s: float) -> tuple[int | None, str, bool]:
    """Read server frames until a close frame or EOF, at most ``timeout_s``.

    Returns:
        ``(close code or None, close reason, whether the TCP connection ended)``.
    """
    deadline = time.monotonic() + timeout_s
    buf = b""
    code: int | None = None
    reason = ""
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = sock.recv(65536)
        except TimeoutError:
            break
        except OSError:
            return code, reason, True
        if not data:
            return code, reason, True
        buf += data
        while len(buf) >= 2:
            n, at = buf[1] & 0x7F, 2
            if n == 126:
                n, at = struct.unpack("!H", buf[2:4])[0], 4
            elif n == 127:
                n, at = struct.unpack("!Q", buf[2:10])[0], 10
            if len(buf) < at + n:
                break
            opcode, payload, buf = buf[0] & 0x0F, buf[at : at + n], buf[at + n :]
            if opcode == 8 and code is None:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                reason = payload[2:].decode("utf-8", "replace")
    return code, reason, False


def rss_mb(pid: int) -> float:
    """Resident set size of process ``pid``, MiB (``VmRSS`` in /proc)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise LookupError(pid)
