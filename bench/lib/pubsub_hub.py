"""Peer (b): a Redis pub/sub request-reply relay, the way Socket.IO's and Django
Channels' Redis adapters route messages between processes.

Hub (this file, asyncio + ``websockets`` + ``redis`` (redis-py)): it verifies the token
on the upgrade (the same tokens as deskbridge), reads ``hello``, SUBSCRIBEs
``rpc:{<user>}`` on its one pub/sub connection and answers ``welcome``. A request
published there is sent to the socket as a ``job`` frame; the ``job_result`` is PUBLISHed
to the reply channel the request named. On disconnect it UNSUBSCRIBEs.

Caller (:class:`PubSubCaller`): one pub/sub connection per caller process subscribed to
its own reply channel; a call PUBLISHes ``{id, reply, name, args}`` to the user's channel
(0 receivers -> offline) and waits for the reply with that id.

What it guarantees: nothing beyond the happy path. At-most-once: a request published
while no hub holds the user, or held by a hub that dies, or whose reply is published
while the caller's subscriber reconnects, is lost and the caller times out. No presence
key (the PUBLISH receiver count is the presence check, so it is exact but only for this
instant), no queue, no redelivery, no job ids, no deadlines, no pings from the hub, no
cancellation, no idempotency. Two Redis round trips per call, no keys written.

Usage: python bench/lib/pubsub_hub.py --port P --redis-url URL --secret S
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import uuid

import redis.asyncio as aioredis
from websockets.asyncio.server import ServerConnection, serve

#: redis-py's pool refuses a 101st connection by default ("Too many connections"); this
#: design holds one connection per blocked command (a reader per user, a waiting caller),
#: so the pool must be as large as the population.
MAX_CONNECTIONS = 100_000


class PubSubHub:
    def __init__(self, redis: aioredis.Redis, secret: str) -> None:
        self.redis = redis
        self.secret = secret
        self.pubsub = redis.pubsub(ignore_subscribe_messages=True)
        self.sockets: dict[str, ServerConnection] = {}
        self.pending: dict[str, tuple[str, str]] = {}  # delivery id -> (reply channel, request id)

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
        channel = f"rpc:{{{user}}}"
        self.sockets[user] = ws
        await self.pubsub.subscribe(channel)
        await ws.send(
            json.dumps(
                {
                    "type": "welcome",
                    "session_id": uuid.uuid4().hex,
                    "heartbeat_s": 10.0,
                    "ping_interval_s": 10.0,
                    "ping_timeout_s": 10.0,
                }
            )
        )
        try:
            async for raw in ws:
                frame = json.loads(raw)
                kind = frame.get("type")
                if kind == "job_result":
                    target = self.pending.pop(frame["id"], None)
                    if target is None:
                        continue
                    reply, request_id = target
                    body = {"id": request_id, "ok": frame["ok"]}
                    body["result" if frame["ok"] else "error"] = frame.get(
                        "result" if frame["ok"] else "error"
                    )
                    await self.redis.publish(reply, json.dumps(body))
                elif kind == "ping":
                    await ws.send(json.dumps({"type": "pong", "nonce": frame["nonce"]}))
        finally:
            if self.sockets.get(user) is ws:
                del self.sockets[user]
                await self.pubsub.unsubscribe(channel)

    async def route(self) -> None:
        """The one subscriber: every request published to a user this process holds."""
        while True:
            # listen() returns when nothing is subscribed; main() subscribes a channel of
            # the hub's own first, so this loop only turns again after a broken connection
            async for message in self.pubsub.listen():
                if message["type"] == "message":
                    await self._forward(message)
            await asyncio.sleep(0.1)

    async def _forward(self, message: dict) -> None:
        channel = message["channel"].decode()
        user = channel[channel.index("{") + 1 : -1]
        ws = self.sockets.get(user)
        if ws is None:
            return  # at-most-once: nobody here for it any more
        request = json.loads(message["data"])
        delivery = uuid.uuid4().hex
        self.pending[delivery] = (request["reply"], request["id"])
        job = {
            "type": "job",
            "id": delivery,
            "job_id": request["id"],
            "name": request["name"],
            "args": request["args"],
            "idempotency_key": request["id"],
            "deadline": request["deadline"],
        }
        await ws.send(json.dumps(job))


class PubSubCaller:
    """The caller side (one per process): ``await caller.call(user, name, args)``."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self.redis = redis
        self.reply = f"reply:{uuid.uuid4().hex}"
        self.pubsub = redis.pubsub(ignore_subscribe_messages=True)
        self.waiting: dict[str, asyncio.Future] = {}
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        await self.pubsub.subscribe(self.reply)
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self.pubsub.listen():
            if message["type"] != "message":
                continue
            body = json.loads(message["data"])
            fut = self.waiting.pop(body["id"], None)
            if fut is not None and not fut.done():
                fut.set_result(body)

    async def call(self, user: str, name: str, args: dict, timeout_s: float = 10.0):
        import time

        request_id = uuid.uuid4().hex
        fut = asyncio.get_running_loop().create_future()
        self.waiting[request_id] = fut
        request = {
            "id": request_id,
            "reply": self.reply,
            "name": name,
            "args": args,
            "deadline": time.time() + timeout_s,
        }
        try:
            receivers = await self.redis.publish(f"rpc:{{{user}}}", json.dumps(request))
            if receivers == 0:
                raise LookupError(f"{user} offline")
            body = await asyncio.wait_for(fut, timeout_s)
        finally:
            self.waiting.pop(request_id, None)
        if not body["ok"]:
            raise RuntimeError(body["error"])
        return body["result"]

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self.pubsub.aclose()


async def main(args: argparse.Namespace) -> None:
    redis = aioredis.Redis.from_url(
        args.redis_url, socket_timeout=None, max_connections=MAX_CONNECTIONS
    )
    hub = PubSubHub(redis, args.secret)
    # Connect the subscriber before any socket arrives: redis-py's PubSub opens its
    # connection on the first SUBSCRIBE, and concurrent first SUBSCRIBEs would each open
    # one (all but the last left subscribed and unread).
    await hub.pubsub.subscribe(f"hub:{uuid.uuid4().hex}")
    async with serve(hub.handler, "127.0.0.1", args.port, compression=None, ping_interval=None):
        await hub.route()
        await asyncio.Future()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--redis-url", required=True)
    p.add_argument("--secret", default=os.environ.get("DESKBRIDGE_SECRET", ""))
    asyncio.run(main(p.parse_args()))
