"""A TCP proxy between one hub process and Redis that can partition them (issue: a hub
partitioned from Redis while the rest of the deployment is fine).

No iptables here, so the fault lives in the test process: the hub's
``DESKBRIDGE_REDIS_URL`` names this proxy, which forwards to the real Redis. Modes:

* ``blackhole()``: nothing is forwarded either way and every socket stays open (no FIN,
  no RST): what a network partition or a dead NAT entry does. Bytes read meanwhile are
  held, as TCP's retransmissions would hold them, and delivered on ``heal()`` (a
  connection the hub has given up on meanwhile is closed by the hub, as usual). New
  connections are accepted (the kernel does that) but not connected upstream until the
  heal: the hub's connect handshake (HELLO) gets no answer.
* ``blackhole(only_blocking=True)``: the same for the connections that have carried a
  ``BLMPOP`` on a wake list (the hub's blocking wake-up read) by then, only (a dead NAT
  entry of that one flow); the others, and connections opened later, work.
* ``delay(seconds)``: every chunk from Redis is forwarded ``seconds`` after it was read
  (a slow path: Redis answers this hub only after that long; requests go at once).
* ``heal()``: forward again (held bytes first, in order).

Threads, bounded waits; ``close()`` closes everything.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

_WAKE_BLMPOP = b"BLMPOP"
_WAKE_KEY = b"bridge:wake:"


class RedisPartitionProxy:
    def __init__(self, upstream_port: int, *, port: int = 0) -> None:
        self.upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port = self._listener.getsockname()[1]
        self._cond = threading.Condition()
        self._holes = False  # every connection black-holed (else: those marked held)
        self._delay_s = 0.0
        self._closed = False
        self._conns: list[dict[str, Any]] = []
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True, name="redis-proxy").start()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    # -- control -----------------------------------------------------------------------

    def blackhole(self, *, only_blocking: bool = False) -> int:
        """Black-hole every connection (and new ones), or only those that carried the
        wake-up BLMPOP so far; returns how many connections that covers now."""
        with self._cond:
            if only_blocking:
                held = [c for c in self._conns if c["blocking"] and not c["gone"]]
                for conn in held:
                    conn["held"] = True
            else:
                self._holes = True
                held = [c for c in self._conns if not c["gone"]]
            self._cond.notify_all()
            return len(held)

    def delay(self, seconds: float) -> None:
        with self._cond:
            self._delay_s = seconds
            self._cond.notify_all()

    def heal(self) -> None:
        with self._cond:
            self._holes = False
            self._delay_s = 0.0
            for conn in self._conns:
                conn["held"] = False
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._holes = False
            self._cond.notify_all()
        self._listener.close()
        for conn in list(self._conns):
            for end in ("client", "upstream"):
                sock = conn.get(end)
                if sock is not None:
                    try:
                        sock.close()
                    except OSError:
                        pass

    def blocking(self) -> int:
        """Open connections that have carried the wake-up BLMPOP."""
        return sum(1 for c in self._conns if c["blocking"] and not c["gone"])

    def live(self) -> int:
        """Connections whose client end is still open."""
        return sum(1 for c in self._conns if not c["gone"])

    # -- plumbing ------------------------------------------------------------------------

    def _held(self, conn: dict[str, Any]) -> bool:
        if self._closed:
            return False
        return self._holes or conn["held"]

    def _wait_open(self, conn: dict[str, Any]) -> bool:
        """Wait while ``conn`` is black-holed; False once the proxy is closed."""
        with self._cond:
            while self._held(conn):
                self._cond.wait(0.2)
            return not self._closed

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.accepted += 1
            conn: dict[str, Any] = {"client": client, "upstream": None, "blocking": False}
            conn["gone"] = conn["held"] = False
            with self._cond:
                if self._closed:  # closed meanwhile: close() did not see it
                    client.close()
                    return
                self._conns.append(conn)
            threading.Thread(target=self._start, args=(conn,), daemon=True).start()

    def _start(self, conn: dict[str, Any]) -> None:
        if not self._wait_open(conn):  # a new connection in a partition: SYN dropped
            return
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
            upstream.settimeout(None)
        except OSError:
            conn["client"].close()
            conn["gone"] = True
            return
        with self._cond:
            if self._closed:  # closed while connecting: close() did not see ``upstream``
                upstream.close()
                conn["client"].close()
                return
            conn["upstream"] = upstream
        threading.Thread(target=self._pump, args=(conn, "client", "upstream"), daemon=True).start()
        threading.Thread(target=self._pump, args=(conn, "upstream", "client"), daemon=True).start()

    def _pump(self, conn: dict[str, Any], src_end: str, dst_end: str) -> None:
        """Read ``src`` as fast as it sends (so a delay is a constant latency, not one
        that grows chunk by chunk); the chunks are forwarded by ``_forward``."""
        import collections

        src = conn[src_end]
        queue: collections.deque[tuple[float, bytes]] = collections.deque()
        ready = threading.Condition()
        threading.Thread(
            target=self._forward, args=(conn, src_end, dst_end, queue, ready), daemon=True
        ).start()
        tail = b""
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if src_end == "client" and data:
                seen = tail + data
                if _WAKE_BLMPOP in seen and _WAKE_KEY in seen:
                    conn["blocking"] = True
                tail = data[-64:]
            with ready:
                queue.append((time.monotonic(), data))
                ready.notify()
            if not data:
                return

    def _forward(
        self,
        conn: dict[str, Any],
        src_end: str,
        dst_end: str,
        queue: Any,
        ready: threading.Condition,
    ) -> None:
        dst = conn[dst_end]
        while True:
            with ready:
                while not queue:
                    ready.wait(0.2)
                read_at, data = queue.popleft()
            if not self._wait_open(conn):
                return
            if data and self._delay_s and src_end == "upstream":
                left = read_at + self._delay_s - time.monotonic()
                if left > 0:
                    time.sleep(left)
            if not data:
                if src_end == "client":
                    conn["gone"] = True
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            try:
                dst.sendall(data)
            except OSError:
                return
