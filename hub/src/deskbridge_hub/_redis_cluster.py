"""Redis Cluster over our own connection sessions: slot routing, MOVED / ASK / TRYAGAIN.

Selected by ``redis+cluster://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...][/0][?options]``
(``rediss+cluster://`` for TLS; the same query options as ``rediss://``). The listed
nodes are seeds: the slot map comes from ``CLUSTER SLOTS`` on the first that answers.

A :class:`ClusterSession` has the interface of one ``_Session`` (``execute``, ``groups``,
``subscriber``, ``statistics``, ...) and holds one ``_Session`` per primary node, each
bounded as ``_redis_session`` describes (so the bound is per node). A batch of commands
goes to the primary owning the slot of its keys (``_redis_slots``: a batch or script
with keys of two slots is refused as a programming error); keyless batches (PING, INFO,
PUBLISH) go to any node. A MOVED reply (resharding moved the slot) updates the map and
sends the command to the named node; ASK (slot being migrated, key already moved) sends it
once to the named node behind ASKING; TRYAGAIN (a multi-key command during migration) and
CLUSTERDOWN are retried with growing pauses for about 4.5 s (``_RETRY_PAUSES_S``), the slot
map read again after a CLUSTERDOWN (a node removed from the cluster answers "Hash slot not
served" for the slots it had) and after a node could not be reached (failed over,
removed), at most once a second; what outlives that is the caller's SubstrateUnavailable
(``_redis_conn``). Only the commands (or MULTI ... EXEC blocks) that were redirected
are sent again: the others of the batch ran, and running a command twice is not
harmless (a script that takes entries would take a second batch and lose the first). A
batch is therefore not ordered across a redirection: what must run together is one
script or one MULTI block. Redirections are followed at most ``_MAX_REDIRECTS`` times
per batch. A keyless batch whose node cannot be reached (a refused connect: it did not
run) goes to the next known node, which later keyless batches keep using (it went to
the first seed only: with that node down, /healthz failed and every PUBLISH raised).
Pub/sub has one subscriber connection, on any primary of the map (PUBLISH is broadcast
to every node of a cluster), and it follows the cluster (:class:`ClusterSubscriberHost`):
when its connection breaks it connects to the next node, and while it is held the map is
read every ``_MEMBERSHIP_CHECK_S`` (from another node first) and a subscriber whose node
serves no slot any more (removed, forgotten) is moved; each move delivers a gap to every
subscription (``_redis_pubsub``). It stayed on the first seed's connection: with that node
dead or removed, messages published through the others never arrived.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
from coredis.exceptions import AskError, ClusterDownError, MovedError, TryAgainError
from coredis.exceptions import ConnectionError as RedisConnectionError

from ._own_liveness import own_liveness
from ._redis_pubsub import Subscriber
from ._redis_session import ConnectionStatistics, _Conn, _Session
from ._redis_slots import SLOTS, CrossSlot, batch_slot

#: Redirections (MOVED / ASK) followed for one batch before giving up.
_MAX_REDIRECTS = 8
#: Pauses (seconds) before the retries of TRYAGAIN / CLUSTERDOWN, about 4.5 s in all: a
#: migration step settles in milliseconds, a key by key migration or a failover in
#: seconds. Past them the error is the caller's SubstrateUnavailable (was 8 x 50 ms: a
#: slow migration failed every submit of its users, a primary down a few seconds every
#: command).
_RETRY_PAUSES_S = (0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0)
#: The slot map is read again at most this often, seconds (on CLUSTERDOWN and on a node
#: that cannot be reached: a node removed or failed over is named by a stale map).
_REFRESH_EVERY_S = 1.0
#: While the subscriber connection is held, the slot map is read this often, seconds, to
#: learn whether the subscriber's node still serves slots (a node removed from the
#: cluster but still running keeps the connection open and hears no PUBLISH of the
#: others): one CLUSTER SLOTS per process each time.
_MEMBERSHIP_CHECK_S = 5.0


def is_cluster_url(url: str) -> bool:
    return urlsplit(url).scheme in ("redis+cluster", "rediss+cluster")


def seeds(url: str) -> list[tuple[str, int]]:
    """``redis+cluster://u:p@h1:p1,h2:p2/0`` -> ``[(h1, p1), (h2, p2)]``."""
    netloc = urlsplit(url).netloc.rpartition("@")[2]
    out = []
    for part in netloc.split(","):
        host, _, port = part.rpartition(":")
        out.append((host or "localhost", int(port or 6379)))
    return out


def node_url(url: str, host: str, port: int) -> str:
    """The plain ``redis://`` (or ``rediss://``) URL of one node of the cluster ``url``."""
    parts = urlsplit(url)
    userinfo, at, _ = parts.netloc.rpartition("@")
    scheme = "rediss" if parts.scheme.startswith("rediss") else "redis"
    return urlunsplit((scheme, f"{userinfo}{at}{host}:{port}", "/0", parts.query, ""))


class ClusterSession:
    """The connections of one event-loop run to every primary of a Redis Cluster."""

    def __init__(self, url: str, **session_kwargs: Any) -> None:
        self._url = url
        self._session_kwargs = session_kwargs
        self._seeds = seeds(url)
        self._nodes: dict[tuple[str, int], _Session] = {}
        self._slots: list[tuple[str, int] | None] = [None] * SLOTS
        self._map_lock = anyio.Lock()
        self._tg = anyio.create_task_group()
        self.connect_timeout_s: float = session_kwargs["connect_timeout_s"]
        self.max_connections: int = session_kwargs["max_connections"]
        self.groups: set[str] = set()
        self.closed = False
        self._ready: dict[tuple[str, int], anyio.Event] = {}
        #: Per hosted node: the scope that ends its hosting (``_prune``).
        self._hosting: dict[tuple[str, int], anyio.CancelScope] = {}
        self._opened = False
        self._refreshed_at = -math.inf
        self._refresh_pending = False
        self._mapped = False  # a slot map was read
        self._first = self._node(self._seeds[0])
        self._subscriber_host = ClusterSubscriberHost(self)
        #: Where keyless batches go: the first seed until it cannot be reached.
        self._keyless: tuple[str, int] = self._seeds[0]
        self.subscriber = Subscriber(self._subscriber_host, session_kwargs["command_timeout_s"])

    def _node(self, address: tuple[str, int]) -> _Session:
        """The session of one node (created on first mention, opened in the cluster
        session's task group, which closes it)."""
        node = self._nodes.get(address)
        if node is None:
            node = self._nodes[address] = _Session(
                node_url(self._url, *address), **self._session_kwargs
            )
            self._ready[address] = anyio.Event()
            if self._opened:
                self._tg.start_soon(self._host, address)
        return node

    async def _get(self, address: tuple[str, int]) -> _Session:
        node = self._node(address)
        await self._ready[address].wait()
        return node

    async def _host(self, address: tuple[str, int]) -> None:
        node = self._nodes[address]
        ready = self._ready[address]
        await node.open()  # no I/O: enters the node's task group in this task
        scope = self._hosting[address] = anyio.CancelScope()
        ready.set()
        try:
            with scope:
                await anyio.sleep_forever()
        finally:
            if self._hosting.get(address) is scope:
                del self._hosting[address]
            await node.close()  # exits the node's task group, entered above in this task

    def _prune(self) -> None:
        """Close the sessions of the nodes the map no longer names (removed from the
        cluster, or primaries no more), seeds excepted: their connections stayed open
        for as long as the process ran, and a removed node was still asked for maps and
        keyless commands. Commands in flight there fail as from an unreachable node (a
        removed node would have redirected them anyway); a node named again (MOVED, a
        later map) gets a new session. Keyless batches move to a primary of the map
        when the node they went to is not one."""
        owners = set(self._slots)
        if self._keyless not in owners:
            # keyless batches (PING, PUBLISH) went on to a seed removed from the cluster
            # but still running: /healthz passed and PUBLISH reached nobody (review)
            self._keyless = next((a for a in self._slots if a is not None), self._keyless)
        for address in list(self._nodes):
            scope = self._hosting.get(address)
            if address in owners or address in self._seeds or scope is None:
                continue  # in the map, a seed, or not hosted yet (the next map decides)
            del self._nodes[address], self._ready[address], self._hosting[address]
            scope.cancel()

    async def open(self) -> None:
        await self._tg.__aenter__()
        self._opened = True
        for address in list(self._nodes):
            self._tg.start_soon(self._host, address)
        await self._ready[self._seeds[0]].wait()

    async def close(self) -> None:
        self.closed = True
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(None, None, None)

    def drop_connections(self) -> None:
        for node in self._nodes.values():
            node.drop_connections()

    def start_soon(self, fn: Callable[[], Coroutine[object, object, None]]) -> None:
        self._tg.start_soon(fn)

    def statistics(self) -> ConnectionStatistics:
        """Summed over the nodes (``max_connections`` is per node)."""
        stats = [n.statistics() for n in self._nodes.values()]
        return ConnectionStatistics(
            max_connections=self.max_connections,
            opened_total=sum(s.opened_total for s in stats),
            shared=sum(s.shared for s in stats),
            blocking=sum(s.blocking for s in stats),
            blocking_busy=sum(s.blocking_busy for s in stats),
            blocking_waiting=sum(s.blocking_waiting for s in stats),
            subscriber=int(self.subscriber.connected),
            polls_total=sum(s.polls_total for s in stats),
        )

    async def refresh_slots(self, avoid: tuple[str, int] | None = None) -> None:
        """Read the slot map (CLUSTER SLOTS) from the first node that answers with one,
        ``avoid`` last (a node that just refused: cut off from the others, it may still
        name itself). A node that serves no slot (removed from the cluster, reset), or
        cannot be reached, is passed over.

        Raises:
            the last node's error when none answers with a map.
        """
        async with self._map_lock:
            self._refreshed_at = anyio.current_time()
            errors: list[BaseException] = []
            last = [avoid] if avoid is not None else []
            order = [a for a in dict.fromkeys([*self._seeds, *self._nodes]) if a != avoid]
            for address in [*order, *last]:
                try:
                    node = await self._get(address)
                    (reply,) = await node.execute(
                        (b"CLUSTER", b"SLOTS"), timeout_s=self.connect_timeout_s
                    )
                except (RedisConnectionError, OSError) as exc:  # a refused connect raises
                    reply = exc
                if isinstance(reply, BaseException):
                    errors.append(reply)
                    continue
                if not reply:
                    errors.append(ClusterDownError(f"{address[0]}:{address[1]} serves no slot"))
                    continue
                slots: list[tuple[str, int] | None] = [None] * SLOTS
                for start, end, primary, *_ in reply:
                    owner = (str(primary[0]) or address[0], int(primary[1]))
                    self._node(owner)
                    for slot in range(int(start), int(end) + 1):
                        slots[slot] = owner
                # a fresh map, not the old one patched: a slot the answer leaves out (its
                # node removed) must not stay with a node that no longer serves it
                self._slots = slots
                self._mapped = True
                self._prune()
                return
            raise errors[-1]

    async def _refresh_soon(self, avoid: tuple[str, int] | None = None) -> None:
        """Read the slot map again, at most once per ``_REFRESH_EVERY_S`` (a request
        meanwhile waits for that); a failure leaves the map as it was (the commands
        report the outage)."""
        if self._refresh_pending:  # one is on its way: it reads the map for us all
            return
        self._refresh_pending = True
        try:
            wait_s = self._refreshed_at + _REFRESH_EVERY_S - anyio.current_time()
            if wait_s > 0:  # read lately: once more when allowed, not never
                await anyio.sleep(wait_s)
            with contextlib.suppress(Exception):
                await self.refresh_slots(avoid)
        finally:
            self._refresh_pending = False

    async def execute(
        self, *commands: tuple[Any, ...], timeout_s: float | None, resend: bool | None = None
    ) -> list[Any]:
        """As ``_Session.execute`` (``resend`` included), on the primary owning the
        batch's slot.

        Raises:
            CrossSlot: the batch names keys of two slots (a programming error).
        """
        try:
            slot = batch_slot(commands)
        except CrossSlot:
            return await self._split(commands, timeout_s, resend)
        if slot is None and commands and _name(commands[0]) == b"SCRIPT":
            return await self._everywhere(commands, timeout_s)
        if slot is not None and self._slots[slot] is None and not self._mapped:
            await self.refresh_slots()  # no map yet (with one: a slot nobody serves)
        units = _units(commands)
        replies: list[Any] = [None] * len(commands)
        owned: list[list[int]] = units  # units to send to the slot's owner
        asked: list[list[int]] = []  # units to send behind ASKING to ``ask_node``
        ask_node: tuple[str, int] | None = None
        pause = down = False
        pauses = iter(_RETRY_PAUSES_S)
        address: tuple[str, int] = self._keyless
        tried = 0  # other nodes tried for a keyless batch whose node could not be reached
        for _ in range(_MAX_REDIRECTS + len(_RETRY_PAUSES_S) + len(self._seeds) + len(self._nodes)):
            if asked and ask_node is not None:
                sending, asked, asking = asked, [], True
                address = ask_node
            elif owned:
                if pause:
                    pause_s = next(pauses, None)
                    if pause_s is None:
                        return replies  # TRYAGAIN / CLUSTERDOWN outlived the retries
                    await anyio.sleep(pause_s)
                    if down:  # a node removed, or the map moved on: read it again
                        await self._refresh_soon(avoid=address)
                    pause = down = False
                sending, owned, asking = owned, [], False
                owner = self._slots[slot] if slot is not None else self._keyless
                address = owner or self._keyless
            else:
                return replies
            batch: list[tuple[Any, ...]] = []
            for unit in sending:  # ASKING holds for one command, or for one MULTI block
                batch += [(b"ASKING",)] if asking else []
                batch += [commands[i] for i in unit]
            try:
                node = await self._get(address)
                answered = await node.execute(*batch, timeout_s=timeout_s, resend=resend)
            except (RedisConnectionError, OSError) as exc:
                # the node cannot be reached (a refused connect raises): every command
                # of the batch has it as its reply, as a transport failure would, so the
                # map is read again below and a split batch's other nodes keep theirs
                answered = [exc] * len(batch)
                if slot is None and not asking and tried < len(self._seeds) + len(self._nodes):
                    # a keyless batch (PING, INFO, PUBLISH) that did not run: any node
                    # may answer it, so the next known one does (it stayed on the first
                    # seed: /healthz failed while that one node was down or removed)
                    tried += 1
                    self._keyless = self._next_keyless(address)
                    owned += sending
                    continue
            got = iter(answered)
            for unit in sending:
                if asking:
                    next(got)
                mine = [next(got) for _ in unit]
                for i, reply in zip(unit, mine, strict=True):
                    replies[i] = reply
                # Only a unit that did not run is sent again: the others ran (a unit that
                # ran twice would, e.g., take a second batch of entries and lose the first).
                moved = next((r for r in mine if isinstance(r, MovedError)), None)
                ask = next((r for r in mine if isinstance(r, AskError)), None)
                if slot is not None and (
                    moved is not None
                    or ask is not None
                    or any(isinstance(r, _TROUBLE) for r in mine)
                ):  # an absent presence in this slot proves nothing for a while
                    own_liveness().slot_troubled(slot)
                if moved is not None:
                    self._slots[moved.slot_id] = moved.node_addr
                    self.groups.clear()  # a moved stream may need its group checked again
                    owned.append(unit)
                    # resharding, or a node given up: the whole map (at most once a
                    # second), so that nodes that serve nothing any more are let go
                    self.start_soon(functools.partial(self._refresh_soon))
                elif ask is not None:
                    ask_node = ask.node_addr
                    asked.append(unit)
                elif any(isinstance(r, TryAgainError | ClusterDownError) for r in mine):
                    owned.append(unit)
                    pause = True
                    down = down or any(isinstance(r, ClusterDownError) for r in mine)
                elif any(isinstance(r, RedisConnectionError | OSError) for r in mine):
                    # a node gone (killed, removed, failed over): its slots may be served
                    # elsewhere now; the caller's retry finds out from a fresh map
                    self.start_soon(functools.partial(self._refresh_soon))
        return replies

    def _next_keyless(self, failed: tuple[str, int]) -> tuple[str, int]:
        """The node after ``failed`` among the primaries of the map, then the seeds and
        the other known nodes (in that order, wrapping round)."""
        owners = [a for a in self._slots if a is not None]
        order = list(dict.fromkeys([*owners, *self._seeds, *self._nodes]))
        if failed not in order:
            return order[0]
        return order[(order.index(failed) + 1) % len(order)]

    async def _split(
        self,
        commands: tuple[tuple[Any, ...], ...],
        timeout_s: float | None,
        resend: bool | None = None,
    ) -> list[Any]:
        """A pipeline whose commands live in several slots: one sub-batch per slot, sent
        concurrently, replies put back in order. Each command, and each MULTI ... EXEC
        block, must be in one slot itself (a script or transaction over two users' keys
        is still refused: CrossSlot)."""
        groups: dict[int | None, list[int]] = {}
        for unit in _units(commands):
            slot = batch_slot(tuple(commands[j] for j in unit))  # CrossSlot if it spans
            groups.setdefault(slot, []).extend(unit)
        replies: list[Any] = [None] * len(commands)

        async def run(indexes: list[int]) -> None:
            got = await self.execute(
                *(commands[i] for i in indexes), timeout_s=timeout_s, resend=resend
            )
            for i, reply in zip(indexes, got, strict=True):
                replies[i] = reply

        async with anyio.create_task_group() as tg:
            for indexes in groups.values():
                tg.start_soon(run, indexes)
        return replies

    async def _everywhere(
        self, commands: tuple[tuple[Any, ...], ...], timeout_s: float | None
    ) -> list[Any]:
        """SCRIPT LOAD / FLUSH on every primary of the slot map (scripts are cached per
        node), concurrently; returns the replies (values or exception instances, as
        ``execute``) of the first primary of the map that could be reached.

        A primary that cannot be reached (dead, removed, cut off) is passed over: it is
        no reason to fail a user whose slot lives on a healthy node. It runs the script
        later anyway: EVALSHA answers NOSCRIPT there, and the caller loads it again (the
        heartbeat) or sends it as EVAL (``RedisCommandBase._script``). When no primary
        could be reached, every reply is the last connection error (the caller's
        SubstrateUnavailable). A node that answers (an error reply included) counts as
        reached: its replies are returned as they are.
        """
        await self.refresh_slots()
        owners = list(dict.fromkeys(a for a in self._slots if a is not None))
        answers: dict[tuple[str, int], list[Any]] = {}

        async def one(address: tuple[str, int]) -> None:
            try:
                node = await self._get(address)
                answers[address] = await node.execute(*commands, timeout_s=timeout_s)
            except (RedisConnectionError, OSError) as exc:  # a refused connect raises
                answers[address] = [exc] * len(commands)

        async with anyio.create_task_group() as tg:
            for address in owners:
                tg.start_soon(one, address)
        unreached: list[Any] = []
        for address in owners:
            replies = answers[address]
            if all(isinstance(r, RedisConnectionError | OSError) for r in replies):
                unreached = replies
                self.start_soon(functools.partial(self._refresh_soon, address))
                continue
            return replies
        return unreached or [RedisConnectionError("no primary in the slot map")] * len(commands)


#: Replies by which a slot refused a command or could not be reached (``_own_liveness``).
_TROUBLE = (TryAgainError, ClusterDownError, RedisConnectionError, OSError)


def _units(commands: tuple[tuple[Any, ...], ...]) -> list[list[int]]:
    """The indexes of ``commands`` by unit: one command, or one MULTI ... EXEC block.

    Raises:
        CrossSlot: a MULTI without its EXEC (or DISCARD) in the batch.
    """
    units: list[list[int]] = []
    unit: list[int] = []
    for i, command in enumerate(commands):
        unit.append(i)
        if _name(commands[unit[0]]) == b"MULTI" and _name(command) not in (b"EXEC", b"DISCARD"):
            continue
        units.append(unit)
        unit = []
    if unit:
        raise CrossSlot("MULTI without EXEC in a batch")
    return units


def _name(command: tuple[Any, ...]) -> bytes:
    head = command[0]
    return (head if isinstance(head, bytes) else str(head).encode()).split()[0].upper()


class ClusterSubscriberHost:
    """The subscriber connection of a :class:`ClusterSession`, on any node (the
    ``SubscriberHost`` of ``_redis_pubsub``'s :class:`Subscriber`).

    ``connect`` tries the primaries of the slot map, starting after the node of the last
    connection (whose connection broke, or which was moved away from), then the seeds
    and the other known nodes; the first that accepts a connection holds it. While a
    connection is held, a task reads the slot map every ``_MEMBERSHIP_CHECK_S`` seconds
    (asking other nodes before the subscriber's) and closes the connection when its node
    serves no slot: the subscriber then reconnects elsewhere and every subscription gets
    a gap (``Message(channel, None)``), as after any reconnection.
    """

    def __init__(self, cluster: ClusterSession) -> None:
        self._cluster = cluster
        self.connect_timeout_s = cluster.connect_timeout_s
        #: The node of the connection held (or last held), and the connection.
        self.address: tuple[str, int] | None = None
        self._conn: _Conn | None = None
        self._hosts: dict[_Conn, _Session] = {}
        self._watching = False

    def start_soon(self, fn: Callable[[], Coroutine[object, object, None]]) -> None:
        self._cluster.start_soon(fn)

    def _candidates(self) -> list[tuple[str, int]]:
        cluster = self._cluster
        owners = list(dict.fromkeys(a for a in cluster._slots if a is not None))
        if self.address in owners:  # the next one first: the last one just failed us
            i = owners.index(self.address)
            owners = owners[i + 1 :] + owners[: i + 1]
        return list(dict.fromkeys([*owners, *cluster._seeds, *cluster._nodes]))

    async def connect(self) -> _Conn:
        """A subscriber connection to the first node that accepts one.

        Raises:
            TimeoutError / coredis ConnectionError / ...: the last node's error when no
                node accepted (the subscriber retries with its backoff).
        """
        cluster = self._cluster
        if all(a is None for a in cluster._slots):
            with contextlib.suppress(Exception):  # no map yet: the seeds will do
                await cluster.refresh_slots()
        error: BaseException | None = None
        for address in self._candidates():
            try:
                node = await cluster._get(address)
                c = await node.connect()
            except Exception as exc:  # noqa: BLE001 - this node refused: try the next one
                error = exc
                if address in cluster._slots:  # a primary of the map is gone: read it again
                    cluster.start_soon(functools.partial(cluster._refresh_soon, address))
                continue
            self.address, self._conn = address, c
            self._hosts[c] = node
            if not self._watching:
                self._watching = True
                cluster.start_soon(self._watch)
            return c
        raise error or RedisConnectionError("no Cluster node known")

    async def discard(self, c: _Conn) -> None:
        """Close ``c`` (on the node that hosts it) and wait for the close."""
        node = self._hosts.pop(c, None)
        if self._conn is c:
            self._conn = None
        if node is not None:
            await node.discard(c)

    async def _watch(self) -> None:
        """Every ``_MEMBERSHIP_CHECK_S``: close the held connection when a fresh slot map
        no longer names its node (the subscriber reconnects elsewhere)."""
        while True:
            await anyio.sleep(_MEMBERSHIP_CHECK_S)
            c, address = self._conn, self.address
            if c is None or address is None or not c.usable:
                continue
            try:
                await self._cluster.refresh_slots(avoid=address)
            except Exception:  # noqa: BLE001, S112 - no map: keep what we have
                continue
            if self._conn is c and address not in self._cluster._slots:
                c.scope.cancel()  # its reader ends; the subscriber connects elsewhere
