"""Peer (c): deskbridge's Streams + BLPOP design written plainly in asyncio with
``websockets`` and ``redis`` (redis-py), without deskbridge's recovery machinery.

Hub (this file): verifies the token on the upgrade, reads ``hello``, SETs
``presence:{<user>}`` (PX 30 s, refreshed every 10 s) and answers ``welcome``. Per
connected user one relay task runs ``XREADGROUP GROUP g <consumer> COUNT 32 BLOCK 2000
STREAMS jobs:{<user>} >`` (one pooled connection held per blocked reader; redis-py's
5 s default socket timeout is turned off, as blocking commands need) and sends each
entry as a ``job`` frame; the ``job_result`` is written with one MULTI: RPUSH
``result:{<user>}:<job_id>``, EXPIRE 300 s, XACK.

Caller (:class:`StreamsCaller`): GET presence (none -> offline), XADD ``jobs:{<user>}``
(MAXLEN ~ 500), BLOCKing BLPOP on the result list (one pooled connection held per
waiting caller).

What it guarantees: a job enqueued while the desktop is connected stays in the stream
until acknowledged, and the result is pushed before the XACK (in one MULTI); a caller
retrying from another process could still BLPOP the durable result. What it does not:
no reclaim of entries pending on a dead hub's consumer (they stay pending forever), no
startup drain, no deadlines checked before delivery, no job-id claim, no idempotency, no
cancel, no lost/expired answers, no supersede of an older socket, no pings from the hub,
no bounded connection pool. Caller: 3 round trips; holder: the read plus 1 (MULTI).

Usage: python bench/lib/streams_hub.py --port P --redis-url URL --secret S
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import uuid

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError
from websockets.asyncio.server import ServerConnection, serve

GROUP = "g"
PRESENCE_MS = 30_000
HEARTBEAT_S = 10.0
RESULT_TTL_S = 300


def _keys(user: str) -> tuple[str, str]:
    return f"presence:{{{user}}}", f"jobs:{{{user}}}"


def welcome(session: str) -> dict:
    """The ``welcome`` frame both Streams peers send (``trio_hub.py`` too)."""
    return {
        "type": "welcome",
        "session_id": session,
        "heartbeat_s": HEARTBEAT_S,
        "ping_interval_s": 10.0,
        "ping_timeout_s": 10.0,
    }


#: redis-py's pool refuses a 101st connection by default ("Too many connections"); this
#: design holds one connection per blocked command (a reader per user, a waiting caller),
#: so the pool must be as large as the population.
MAX_CONNECTIONS = 100_000


class StreamsHub:
    def __init__(self, redis: aioredis.Redis, secret: str) -> None:
        self.redis = redis
        self.secret = secret
        self.consumer = f"bench-{os.getpid()}-{uuid.uuid4().hex[:6]}"

    async def handler(self, ws: ServerConnection) -> None:
        from deskbridge_hub import TokenRejected, verify_token

        auth = ws.request.headers.get("Authorization", "") if ws.request else ""
        try:
            user = verify_token(auth.removeprefix("Bearer "), [self.secret])
        except TokenRejected:
            await ws.close(1008, "bad token")
            return
        hello = json.loads(await ws.recv())
        if hello.get("type") != "hello":
            await ws.close(1008, "expected hello")
            return
        presence, stream = _keys(user)
        session = uuid.uuid4().hex
        await self.redis.set(presence, session, px=PRESENCE_MS)
        try:
            await self.redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        await ws.send(json.dumps(welcome(session)))
        pending: dict[str, tuple[str, str]] = {}  # delivery id -> (entry ID, job id)
        tasks = [
            asyncio.create_task(self._relay(ws, user, pending)),
            asyncio.create_task(self._heartbeat(presence, session)),
        ]
        try:
            async for raw in ws:
                frame = json.loads(raw)
                kind = frame.get("type")
                if kind == "job_result":
                    target = pending.pop(frame["id"], None)
                    if target is None:
                        continue
                    entry_id, job_id = target
                    body = {"ok": frame["ok"]}
                    body["result" if frame["ok"] else "error"] = frame.get(
                        "result" if frame["ok"] else "error"
                    )
                    result_key = f"result:{{{user}}}:{job_id}"
                    async with self.redis.pipeline(transaction=True) as pipe:
                        pipe.rpush(result_key, json.dumps(body))
                        pipe.expire(result_key, RESULT_TTL_S)
                        pipe.xack(stream, GROUP, entry_id)
                        await pipe.execute()
                elif kind == "ping":
                    await ws.send(json.dumps({"type": "pong", "nonce": frame["nonce"]}))
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if await self.redis.get(presence) == session.encode():
                await self.redis.delete(presence)

    async def _heartbeat(self, presence: str, session: str) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            try:
                await self.redis.set(presence, session, px=PRESENCE_MS)
            except (ConnectionError, OSError, RedisError) as exc:
                print(f"heartbeat failed: {exc!r}", flush=True)

    async def _relay(self, ws: ServerConnection, user: str, pending: dict) -> None:
        while True:
            try:
                await self._read(ws, user, pending)
            except (ConnectionError, OSError, RedisError) as exc:
                print(f"relay read failed: {exc!r}", flush=True)
                await asyncio.sleep(0.1)

    async def _read(self, ws: ServerConnection, user: str, pending: dict) -> None:
        _, stream = _keys(user)
        while True:
            reply = await self.redis.xreadgroup(
                GROUP, self.consumer, {stream: ">"}, count=32, block=2000
            )
            for _, entries in reply or ():
                for entry_id, fields in entries:
                    delivery = uuid.uuid4().hex
                    job_id = fields[b"job_id"].decode()
                    pending[delivery] = (entry_id.decode(), job_id)
                    job = {
                        "type": "job",
                        "id": delivery,
                        "job_id": job_id,
                        "name": fields[b"name"].decode(),
                        "args": json.loads(fields[b"args"]),
                        "idempotency_key": job_id,
                        "deadline": float(fields[b"deadline"]),
                    }
                    await ws.send(json.dumps(job))


class StreamsCaller:
    """The caller side: ``await caller.call(user, name, args)``."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self.redis = redis

    async def start(self) -> None:
        pass

    async def call(self, user: str, name: str, args: dict, timeout_s: float = 10.0):
        import time

        presence, stream = _keys(user)
        if await self.redis.get(presence) is None:
            raise LookupError(f"{user} offline")
        job_id = uuid.uuid4().hex
        fields = {
            "job_id": job_id,
            "name": name,
            "args": json.dumps(args),
            "deadline": repr(time.time() + timeout_s),
        }
        await self.redis.xadd(stream, fields, maxlen=500, approximate=True)
        reply = await self.redis.blpop([f"result:{{{user}}}:{job_id}"], timeout=timeout_s)
        if reply is None:
            raise TimeoutError(job_id)
        body = json.loads(reply[1])
        if not body["ok"]:
            raise RuntimeError(body["error"])
        return body["result"]

    async def close(self) -> None:
        pass


async def main(args: argparse.Namespace) -> None:
    redis = aioredis.Redis.from_url(
        args.redis_url, socket_timeout=None, max_connections=MAX_CONNECTIONS
    )
    hub = StreamsHub(redis, args.secret)
    async with serve(hub.handler, "127.0.0.1", args.port, compression=None, ping_interval=None):
        await asyncio.Future()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--redis-url", required=True)
    p.add_argument("--secret", default=os.environ.get("DESKBRIDGE_SECRET", ""))
    asyncio.run(main(p.parse_args()))
