"""Instruments read from outside the processes under test (Linux ``/proc`` and Redis INFO).

Nothing here asks the system under test about itself: CPU and memory come from the
kernel, Redis figures from the Redis server, sockets from the kernel's socket tables.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import attrs

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")

#: Commands the instruments themselves send; left out of every command count.
OWN_COMMANDS = frozenset({"info", "client|list", "client", "ping", "config|resetstat", "monitor"})


def _stat_fields(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def group_pids(pgid: int) -> list[int]:
    """Live pids whose process group is ``pgid`` (a hub started with its own session:
    Hypercorn's master and any worker)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = _stat_fields(int(entry))
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(entry))
    return out


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds used so far by ``pids`` (``/proc/<pid>/stat``)."""
    total = 0
    for pid in pids:
        try:
            f = _stat_fields(pid)
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += int(f[11]) + int(f[12])
    return total / CLK_TCK


def rss_bytes(pids: list[int]) -> int:
    """Resident set size of ``pids`` (``/proc/<pid>/statm``), bytes."""
    total = 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def _tcp_table() -> dict[int, tuple[int, int, str]]:
    """inode -> (local port, remote port, state hex) for every IPv4/IPv6 TCP socket."""
    out: dict[int, tuple[int, int, str]] = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            parts = line.split()
            local, remote, state, inode = parts[1], parts[2], parts[3], int(parts[9])
            out[inode] = (
                int(local.rsplit(":", 1)[1], 16),
                int(remote.rsplit(":", 1)[1], 16),
                state,
            )
    return out


def _socket_inodes(pids: list[int]) -> set[int]:
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except (FileNotFoundError, PermissionError):
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


def connections_to(pids: list[int], port: int) -> int:
    """Established TCP connections that ``pids`` hold to ``port`` on this machine."""
    table = _tcp_table()
    return sum(
        1
        for inode in _socket_inodes(pids)
        if inode in table and table[inode][1] == port and table[inode][2] == "01"
    )


def local_ports_to(pids: list[int], port: int) -> set[int]:
    """Local ports of the connections ``pids`` hold to ``port`` (to tell MONITOR lines
    apart by their client address)."""
    table = _tcp_table()
    return {table[i][0] for i in _socket_inodes(pids) if i in table and table[i][1] == port}


def start_private_redis(tmp: Path, port: int, name: str):
    """A private ``redis-server`` (``tests.procs.RedisServer``) on ``port``, refusing a
    port that already answers: a bench must never measure someone else's Redis (its
    counters, its CPU). Raises RuntimeError naming the port."""
    from tests.procs import RedisServer

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            pass
    except OSError:
        pass
    else:
        raise RuntimeError(f"port {port} is already in use (another Redis?); pick another port")
    redis = RedisServer(tmp, port=port, name=name)
    redis.wait_ready()
    if redis.popen.poll() is not None:
        raise RuntimeError(f"redis-server on {port} exited: {redis.output()[-500:]}")
    return redis


class RedisInfo:
    """One persistent raw-RESP connection to Redis for INFO snapshots (no client library,
    so the instrument shares nothing with the systems measured)."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.port = port
        self._sock = socket.create_connection((host, port), timeout=10)
        self._reader = self._sock.makefile("rb")

    def command(self, *args: object):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            data = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(data), data))
        self._sock.sendall(b"".join(out))
        return self._read()

    def _read(self):
        line = self._reader.readline()
        kind, rest = line[:1], line[1:-2].decode()
        if kind == b"-":
            raise RuntimeError(rest)
        if kind == b"+":
            return rest
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._reader.read(n + 2)[:-2].decode()
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._read() for _ in range(n)]
        raise ConnectionError(f"unexpected RESP line {line!r}")

    def info(self, section: str) -> dict[str, str]:
        out = {}
        for line in self.command("INFO", section).splitlines():
            if ":" in line and not line.startswith("#"):
                k, v = line.split(":", 1)
                out[k] = v
        return out

    def snapshot(self) -> Snapshot:
        calls: dict[str, int] = {}
        for k, v in self.info("commandstats").items():
            name = k.removeprefix("cmdstat_")
            fields = dict(kv.split("=", 1) for kv in v.split(","))
            calls[name] = int(fields["calls"])
        stats = self.info("stats")
        clients = self.info("clients")
        return Snapshot(
            calls=calls,
            connections_received=int(stats["total_connections_received"]),
            connected_clients=int(clients["connected_clients"]) - 1,  # less this one
        )

    def close(self) -> None:
        self._reader.close()
        self._sock.close()


@attrs.frozen
class Snapshot:
    calls: dict[str, int]
    connections_received: int
    connected_clients: int

    def commands_since(self, before: Snapshot) -> dict[str, int]:
        """Commands run between ``before`` and this snapshot, by name, less the
        instruments' own (INFO, CLIENT LIST...)."""
        out = {}
        for name, n in self.calls.items():
            if name in OWN_COMMANDS:
                continue
            d = n - before.calls.get(name, 0)
            if d:
                out[name] = d
        return out


def _own_cpu_s() -> float:
    """User + system CPU seconds of this process so far."""
    t = os.times()
    return t.user + t.system


@attrs.define
class Meter:
    """CPU of the hub (and Redis) plus Redis counters across one measured phase."""

    info: RedisInfo
    hub_pgid: int
    redis_pid: int
    _t0: float = 0.0
    _hub_cpu0: float = 0.0
    _redis_cpu0: float = 0.0
    _snap0: Snapshot | None = None
    _hub_ports0: set[int] = attrs.Factory(set)
    _caller_cpu0: float = 0.0

    def start(self) -> None:
        import time

        self._hub_ports0 = local_ports_to(group_pids(self.hub_pgid), self.info.port)
        self._caller_cpu0 = _own_cpu_s()
        self._snap0 = self.info.snapshot()
        self._hub_cpu0 = cpu_s(group_pids(self.hub_pgid))
        self._redis_cpu0 = cpu_s([self.redis_pid])
        self._t0 = time.perf_counter()

    def stop(self, jobs: int) -> dict:
        import time

        elapsed = time.perf_counter() - self._t0
        hub_pids = group_pids(self.hub_pgid)
        hub_cpu = cpu_s(hub_pids) - self._hub_cpu0
        redis_cpu = cpu_s([self.redis_pid]) - self._redis_cpu0
        snap = self.info.snapshot()
        assert self._snap0 is not None
        cmds = snap.commands_since(self._snap0)
        total = sum(cmds.values())
        per = max(jobs, 1)
        return {
            "elapsed_s": elapsed,
            "jobs": jobs,
            "hub_cpu_ms_per_call": hub_cpu * 1000 / per,
            # this process (the callers: Bridge.call, or the peer's client), all threads
            "caller_cpu_ms_per_call": (_own_cpu_s() - self._caller_cpu0) * 1000 / per,
            "hub_cpu_pct": 100 * hub_cpu / elapsed if elapsed else 0.0,
            "redis_cpu_ms_per_call": redis_cpu * 1000 / per,
            "redis_commands": total,
            "redis_commands_per_call": total / per,
            "redis_commands_by_name": dict(sorted(cmds.items(), key=lambda kv: -kv[1])),
            "redis_connections_opened": snap.connections_received
            - self._snap0.connections_received,
            "redis_connections_held": snap.connected_clients,
            "hub_redis_connections_held": connections_to(hub_pids, self.info.port),
            # sockets the hub holds now and did not at the start (one opened and closed
            # within the phase is not seen; redis_connections_opened counts every client)
            "hub_redis_connections_opened": len(
                local_ports_to(hub_pids, self.info.port) - self._hub_ports0
            ),
        }
