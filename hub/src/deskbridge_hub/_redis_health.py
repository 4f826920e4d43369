"""Is this Redis one the hub can work with? (issue 11 item 1)

A Redis can accept connections and still be unable to do what the hub needs: it evicts
keys (``maxmemory`` with any policy but ``noeviction``: a missing presence key then
means nothing), it refuses writes (out of memory under ``noeviction``: OOM; a failed
snapshot: MISCONF; a replica: READONLY), it refuses scripts or keys to this user (ACL:
NOPERM). Each of those makes "desktop offline" a lie, so the hub must answer
``unavailable`` with the cause instead.

One *probe* finds out, in one round trip on a shared connection:

* ``INFO replication memory persistence``: role, ``maxmemory`` and
  ``maxmemory_policy``, AOF on or off;
* ``EVAL`` of a script that writes and reads one key of its own
  (``bridge:health:{<probe id>}``, 10 s TTL): scripting, writes and the ACL key pattern;
* ``EVAL`` of a script that asks the ACL (``redis.acl_check_cmd``) about every command
  the hub sends (:data:`NEEDED_COMMANDS`): a user allowed scripts but not, say,
  XREADGROUP or BLMPOP otherwise passed, then failed every call. A refused command that
  only operator views send (:data:`VIEW_COMMANDS`) is a warning, not a cause: calls go
  on, readiness passes, and only those views answer ``unavailable`` naming the grant;
* when ``DESKBRIDGE_REDIS_URL`` gives a password for the default user, ``AUTH <password>``
  (the one-argument form): HELLO's ``AUTH default <password>`` is accepted with *any*
  password by a Redis without one (its ``default`` user is ``nopass``), so
  ``redis://:secret@`` at such a Redis started silently; the one-argument form answers
  "called without any password configured", which the start-up line turns into a
  WARNING (:data:`UNCHECKED_PASSWORD`). Not a refusal: the hub works, and rolling a
  password out without a stop sets the URL before ``requirepass``.

:func:`interpret` turns the replies into a :class:`Health` (pure, tested without I/O).
:class:`HealthMonitor` probes when the substrate is entered, then every ``interval_s``
and at once (at most once a second) after a command failed for a reason the probe can
see; it logs one line when the state changes (the first probe says in one line what is
wrong, or that all is well) and never one per call.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import attrs

from . import _metrics

log = logging.getLogger("deskbridge.hub.redis")

#: The probe's script: a write and a read of its own key (scripting, writes, ACL keys).
PROBE_SCRIPT = "redis.call('SET', KEYS[1], ARGV[1], 'PX', 10000) return redis.call('GET', KEYS[1])"
#: The commands the hub sends, outside its scripts and inside them, each with arguments
#: of a valid shape (``K``: the probe's key, in the ``bridge:`` key space; ``redis.
#: acl_check_cmd`` checks keys as the command would name them). Seen with MONITOR under
#: the substrate contract suite and a hub serving a desktop, and checked by a hub whose
#: user has only these (``tests/integration/test_degraded_redis.py``); a command added
#: to the hub belongs here too, or a user without it passes the probe and fails calls.
NEEDED_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("PING",),
    ("TIME",),
    ("EVAL", "return", "1", "K"),
    ("EVALSHA", "0" * 40, "1", "K"),
    ("SCRIPT", "LOAD", "return"),
    ("GET", "K"),
    ("SET", "K", "v"),
    ("GETEX", "K"),
    ("DEL", "K"),
    ("EXISTS", "K"),
    ("INCR", "K"),
    ("PEXPIRE", "K", "1"),
    ("PTTL", "K"),
    ("STRLEN", "K"),  # the submit's catalogue digest check (the catalogue's length)
    ("HSET", "K", "f", "v"),
    ("HGET", "K", "f"),
    ("HMGET", "K", "f"),
    ("HGETALL", "K"),
    ("HDEL", "K", "f"),
    ("HKEYS", "K"),
    ("HLEN", "K"),
    ("HEXISTS", "K", "f"),  # the shared MCP sessions' record (``_mcp_store``)
    ("RPUSH", "K", "v"),
    ("LINDEX", "K", "0"),
    ("BLPOP", "K", "1"),
    ("LMPOP", "1", "K", "LEFT"),
    ("BLMPOP", "1", "1", "K", "LEFT"),
    ("XADD", "K", "*", "f", "v"),
    ("XLEN", "K"),
    ("XRANGE", "K", "-", "+"),
    ("XREVRANGE", "K", "+", "-"),
    ("XREAD", "STREAMS", "K", "0"),
    ("XREADGROUP", "GROUP", "g", "c", "STREAMS", "K", ">"),
    ("XACK", "K", "g", "0-1"),
    ("XCLAIM", "K", "g", "c", "0", "0-1"),
    ("XAUTOCLAIM", "K", "g", "c", "0", "0-0"),
    ("XPENDING", "K", "g"),
    ("XGROUP", "CREATE", "K", "g", "0", "MKSTREAM"),
    ("XGROUP", "DELCONSUMER", "K", "g", "c"),
    ("XINFO", "GROUPS", "K"),
    ("XINFO", "CONSUMERS", "K", "g"),
    ("XINFO", "STREAM", "K"),  # the deep beat's and the sweep's look for deleted entries
    ("MULTI",),
    ("EXEC",),
    ("ZADD", "K", "1", "m"),
    ("ZREMRANGEBYSCORE", "K", "-inf", "1"),
    ("ZCARD", "K"),
    ("ZRANGE", "K", "0", "1"),
)
#: The commands of NEEDED_COMMANDS that only operator views send, by the substrate read
#: that sends or relies on them: ``view -> (what it serves, commands)``. Refused, that
#: read raises SubstrateUnavailable (unsent) naming the grant, and nothing else changes;
#: every command not listed here serves calls (the call path, the reader and delivery,
#: and their maintenance: heartbeat, reclaim, prune), so refused it refuses calls. Who
#: sends what is pinned by ``tests/hub/test_redis_acl_views.py``.
VIEW_COMMANDS: dict[str, tuple[str, tuple[str, ...]]] = {
    # ``list_desktops`` counts its index (ZCARD). Its other commands (ZADD and
    # ZREMRANGEBYSCORE at each session start and end, ZRANGE to page) also keep the
    # token revocation index (``_revocation``: ``revoke``'s record, every process's sweep
    # once a heartbeat), which closes revoked sessions: needed, so a user without them
    # is refused calls (fail closed: a revoked laptop must not keep its session).
    "directory": (
        "the desktops directory (GET /v1/admin/desktops, inspect desktops, /admin/)",
        ("ZCARD",),
    ),
    # ``queue_info`` (XLEN + XPENDING; XPENDING serves reclaim too)
    "queue": (
        "queue depths (the admin API's queue, inspect, /metrics queue gauges)",
        ("XLEN",),
    ),
}
#: Every command only operator views send.
_VIEW_ONLY = frozenset(c for _, commands in VIEW_COMMANDS.values() for c in commands)
#: Asks Redis (>= 7.0: ``redis.acl_check_cmd``) whether this connection's user may run
#: each command of ARGV (one per argument, words separated by spaces, ``K`` standing for
#: KEYS[1]); returns the 1-based positions of the refused ones. A command this Redis
#: does not know, or a Redis without the function, is not reported (nothing to say).
ACL_CHECK_SCRIPT = """
local refused = {}
for i, spec in ipairs(ARGV) do
  local words = {}
  for w in string.gmatch(spec, '%S+') do
    if w == 'K' then w = KEYS[1] end
    words[#words + 1] = w
  end
  local ok, allowed = pcall(redis.acl_check_cmd, unpack(words))
  if ok and not allowed then refused[#refused + 1] = i end
end
return refused
"""
#: Commands with subcommands are named as ACL names them (``SCRIPT|LOAD``).
_CONTAINERS = frozenset({"SCRIPT", "XGROUP", "XINFO"})


def needed_command_name(command: tuple[str, ...]) -> str:
    """``("XGROUP", "CREATE", ...)`` -> ``"XGROUP|CREATE"``; ``("GET", "K")`` -> ``"GET"``."""
    return f"{command[0]}|{command[1]}" if command[0] in _CONTAINERS else command[0]


def refused_commands(reply: Any) -> tuple[str, ...]:
    """The ACL check's reply (positions into NEEDED_COMMANDS, 1-based) -> their names;
    an error reply (no scripting: the write probe says so) -> none."""
    if not isinstance(reply, list | tuple):
        return ()
    names = []
    for position in reply:
        i = int(position) - 1
        if 0 <= i < len(NEEDED_COMMANDS):
            names.append(needed_command_name(NEEDED_COMMANDS[i]))
    return tuple(names)


#: The start-up WARNING when Redis answers ``AUTH <password>`` that it has no password.
UNCHECKED_PASSWORD = (
    "DESKBRIDGE_REDIS_URL gives a password, but this Redis has no password for its default "
    "user and accepts any: anyone who reaches it can read and write the hub's keys. Set "
    "requirepass (or an ACL user) to the URL's password, or drop it from the URL"
)
#: The words of Redis' answer to a one-argument AUTH when the default user is ``nopass``.
_NO_PASSWORD_CONFIGURED = "without any password configured"


def password_unchecked(auth: Any) -> bool:
    """Whether the reply to ``AUTH <password>`` (a value or an exception instance; None:
    not sent) says Redis has no password for its default user."""
    return isinstance(auth, BaseException) and _NO_PASSWORD_CONFIGURED in str(auth)


#: Fewest seconds between two probes triggered by failing commands.
_POKE_MIN_INTERVAL_S = 1.0


@attrs.frozen
class Health:
    """What the last probe found.

    Attributes:
        causes: why the hub cannot rely on this Redis, one sentence each; empty when it
            can. Any cause makes readiness fail and calls answer ``unavailable``.
        evicting: keys may be evicted, so an absent key proves nothing.
        notes: worth saying at start but not a reason to refuse work (AOF off; INFO
            not permitted, so role and eviction policy could not be checked).
        summary: the facts, for the start-up line (role, policy, AOF).
        replid: the node's ``master_replid`` (INFO replication): its replication
            history. Another one means another data set: a replica promoted (a
            failover) or a restart without persistence, either of which may have lost
            the last writes. None: not read, or under Cluster (the probe reaches one
            node, whose history is not the store's; ``RedisConnections.probe``).
        refused: commands calls need (the call path and its maintenance) that the ACL
            refuses this user (``SCRIPT|LOAD`` for a subcommand); one of the causes
            when not empty.
        warnings: worth a WARNING at start, not a reason to refuse work
            (:data:`UNCHECKED_PASSWORD`).
        views_refused: commands only operator views send (:data:`VIEW_COMMANDS`) that
            the ACL refuses this user: not a cause (calls are served); those views
            answer ``unavailable`` with :attr:`views_cause`.
    """

    causes: tuple[str, ...] = ()
    evicting: bool = False
    notes: tuple[str, ...] = ()
    summary: str = ""
    replid: str | None = None
    refused: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    views_refused: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.causes

    @property
    def cause(self) -> str:
        return "; ".join(self.causes)

    @property
    def views_cause(self) -> str | None:
        """The warning about :attr:`views_refused` (the views they stop, the grant), or
        None when the operator views have every command they need."""
        if not self.views_refused:
            return None
        stopped = [
            what
            for what, commands in VIEW_COMMANDS.values()
            if set(commands) & set(self.views_refused)
        ]
        return (
            f"{_acl_refusal('the operator views need', self.views_refused)}; until then "
            f"{' and '.join(stopped)} answer unavailable (calls are served)"
        )

    def views_refusing(self, view: str) -> bool:
        """Whether a command ``view`` (a key of :data:`VIEW_COMMANDS`) needs is refused."""
        return bool(set(VIEW_COMMANDS[view][1]) & set(self.views_refused))


def _acl_refusal(whom: str, refused: tuple[str, ...]) -> str:
    """The one wording of an ACL refusal, with the grant that ends it."""
    grants = " ".join(f"+{name.lower()}" for name in refused)
    return (
        f"the Redis user lacks a permission {whom} (ACL): cannot run {', '.join(refused)}; "
        f"grant it (ACL SETUSER <user> {grants})"
    )


def _info_fields(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and not key.startswith("#"):
            fields[key.strip()] = value.strip()
    return fields


def _error_code(exc: BaseException) -> str:
    return str(exc).split(" ", 1)[0]


def interpret(
    info: Any,
    probe: Any,
    *,
    probe_value: str,
    refused: tuple[str, ...] = (),
    unchecked_password: bool = False,
) -> Health:
    """Replies of the probe (each a value or an exception instance) -> Health.
    ``refused``: the commands the hub sends that Redis' ACL refuses this user
    (:func:`refused_commands`); those only operator views send are a warning
    (``Health.views_refused``), the others a cause; ``unchecked_password``: Redis has no
    password for the URL's (:func:`password_unchecked`)."""
    causes: list[str] = []
    notes: list[str] = []
    evicting = False
    replica = False
    summary = []
    replid = None
    if isinstance(info, BaseException):
        notes.append(f"cannot read INFO ({info}): role and eviction policy not checked")
    else:
        fields = _info_fields(info if isinstance(info, str) else str(info))
        role = fields.get("role", "master")  # absent: a proxy that hides it
        policy = fields.get("maxmemory_policy", "?")
        maxmemory = int(fields.get("maxmemory", "0") or 0)
        replid = fields.get("master_replid") or None
        summary.append(f"role {role}")
        summary.append(f"maxmemory-policy {policy}" + ("" if maxmemory else " (no maxmemory)"))
        if role != "master":
            replica = True
            where = fields.get("master_host")
            of = f" of {where}:{fields.get('master_port')}" if where else ""
            causes.append(
                f"it is a replica{of} (role {role}), which refuses writes: "
                "point DESKBRIDGE_REDIS_URL at the primary"
            )
        if maxmemory and policy != "noeviction":
            evicting = True
            causes.append(
                f"maxmemory-policy is {policy} with maxmemory {maxmemory}: Redis may evict "
                "presence, queued jobs and results, so a missing key proves nothing; "
                "set maxmemory-policy noeviction"
            )
        if fields.get("aof_enabled") == "0":
            notes.append("AOF is off: queued jobs and results do not survive a Redis restart")
        summary.append(f"aof {'on' if fields.get('aof_enabled') == '1' else 'off'}")
    if isinstance(probe, BaseException):
        code = _error_code(probe)
        meaning = {
            "OOM": "it is out of memory (maxmemory reached under noeviction): writes refused",
            "MISCONF": "it cannot persist (MISCONF: a failed snapshot): writes refused",
            "READONLY": "it is read-only (a replica): writes refused",
            "NOPERM": "the Redis user lacks a permission the hub needs (ACL)",
            "NOSCRIPT": "scripts are refused",
            "BUSY": "a script is running too long (BUSY)",
            "LOADING": "it is loading its data set",
            "MASTERDOWN": "it is a replica whose primary is down",
        }.get(code, "a scripted write was refused")
        if not (code == "READONLY" and replica):  # already said: it is a replica
            causes.append(f"{meaning}: {probe}")
    elif probe != probe_value:
        causes.append(f"a scripted write did not read back (got {probe!r})")
    views_refused = tuple(name for name in refused if name in _VIEW_ONLY)
    refused = tuple(name for name in refused if name not in _VIEW_ONLY)
    if refused:
        causes.append(_acl_refusal("the hub needs", refused))
    warnings = (UNCHECKED_PASSWORD,) if unchecked_password else ()
    return Health(
        tuple(causes),
        evicting,
        tuple(notes),
        ", ".join(summary),
        replid=replid,
        refused=refused,
        warnings=warnings,
        views_refused=views_refused,
    )


class HealthMonitor:
    """Keeps the last :class:`Health` of one Redis and logs its changes.

    Args:
        address: ``host:port`` for messages.
        probe: runs one probe and returns its Health; raises for transport failures
            (SubstrateUnavailable), which count as "unreachable".
    """

    def __init__(self, address: str, probe: Callable[[], Awaitable[Health]]) -> None:
        self.address = address
        self._probe = probe
        self.health: Health | None = None  # None: not probed yet
        self.unreachable: str | None = None
        self._poked = anyio.Event()
        self._last_probe = -float("inf")
        #: Probes that found another replication history than the one before
        #: (``Health.replid``): failovers and restarts seen.
        self.history_changes = 0

    @property
    def degraded(self) -> str | None:
        """The cause when Redis is reachable but cannot serve the hub, else None."""
        if self.health is not None and not self.health.ok:
            return self.health.cause
        return None

    @property
    def evicting(self) -> bool:
        return self.health is not None and self.health.evicting

    @property
    def refused(self) -> str | None:
        """The ACL cause when the last probe found commands calls need refused to this
        user (nothing the hub enqueues could be served), else None; commands only the
        operator views send are :meth:`views_refused`."""
        if self.health is not None and self.health.refused:
            return next(c for c in self.health.causes if "(ACL)" in c)
        return None

    def views_refused(self, view: str | None = None) -> str | None:
        """The warning (``Health.views_cause``) when the last probe found a command
        ``view`` needs refused to this user (None: any operator view), else None."""
        health = self.health
        if health is None or (view is not None and not health.views_refusing(view)):
            return None
        return health.views_cause

    def poke(self) -> None:
        """Probe again soon (a command failed in a way the probe may explain)."""
        self._poked.set()

    async def check(self) -> Health | None:
        """Probe now, record the result and log a change. Returns the Health, or None
        when Redis could not be reached (``unreachable`` says why)."""
        from ._errors import SubstrateMisconfigured, SubstrateUnavailable

        self._last_probe = anyio.current_time()
        try:
            health = await self._probe()
        except SubstrateUnavailable as exc:
            if self.unreachable is None and isinstance(exc, SubstrateMisconfigured):
                log.error("%s; /healthz fails until it is fixed", exc)  # it answers: not down
            elif self.unreachable is None:
                starting = " (hub starting)" if self.health is None else ""
                log.warning(
                    "Redis at %s unreachable%s: %s; /healthz fails until it answers",
                    self.address,
                    starting,
                    exc,
                )
            self.unreachable = str(exc)
            return None
        was_unreachable, self.unreachable = self.unreachable, None
        before, self.health = self.health, health
        if before is not None and None not in (before.replid, health.replid):
            if before.replid != health.replid:
                self.history_changes += 1
                _metrics.redis_history_changed()
                log.warning(
                    "Redis at %s has another replication history (master_replid %s... -> "
                    "%s...): it failed over or restarted, and may have lost the writes it "
                    "acknowledged last",
                    self.address, (before.replid or "")[:8], (health.replid or "")[:8],
                )  # fmt: skip
        if before is None:
            self._log_start(health)
        elif before.causes != health.causes:
            self._log_change(before, health)
        elif was_unreachable is not None:
            log.info("Redis at %s reachable again", self.address)
        if before is not None and before.views_refused != health.views_refused:
            self._log_views(health)
        return health

    def _log_start(self, health: Health) -> None:
        for warning in health.warnings:
            log.warning("Redis at %s: %s", self.address, warning)
        notes = "".join(f"; note: {n}" for n in health.notes)
        if health.ok and health.views_cause is not None:
            # calls are served: not the ERROR of a hub that cannot serve (issue: a
            # missing dashboard grant took every call down)
            log.warning(
                "Redis at %s usable for calls, but %s (%s)%s",
                self.address,
                health.views_cause,
                health.summary,
                notes,
            )
        elif health.ok:
            log.info("Redis at %s usable: %s%s", self.address, health.summary, notes)
        else:
            views = "" if health.views_cause is None else f"; also {health.views_cause}"
            log.error(
                "Redis at %s cannot serve the hub: %s (%s)%s%s",
                self.address,
                health.cause,
                health.summary,
                views,
                notes,
            )

    def _log_change(self, before: Health, after: Health) -> None:
        if after.ok:
            log.warning("Redis at %s usable again (was: %s)", self.address, before.cause)
        else:
            log.error("Redis at %s cannot serve the hub: %s", self.address, after.cause)

    def _log_views(self, after: Health) -> None:
        if after.views_cause is None:
            log.info("Redis at %s: the operator views have their commands again", self.address)
        else:
            log.warning("Redis at %s: %s", self.address, after.views_cause)

    async def run(self, interval_s: float) -> None:
        """Probe at once, then every ``interval_s`` and soon after each :meth:`poke`."""
        while True:
            await self.check()
            with anyio.move_on_after(interval_s):
                await self._poked.wait()
            self._poked = anyio.Event()
            wait_s = self._last_probe + _POKE_MIN_INTERVAL_S - anyio.current_time()
            if wait_s > 0:
                await anyio.sleep(wait_s)
