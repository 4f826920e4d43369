"""Peer (d): the same Streams + BLPOP design as peer (c) (``streams_hub.py``), written
plainly on deskbridge's own stack: a bare ASGI app served by Hypercorn's trio worker,
``coredis`` as the Redis client, trio. No Quart, no deskbridge machinery.

Why it exists: the issue's targets compare deskbridge (trio + Hypercorn + coredis) with
peers on asyncio + ``websockets`` + redis-py. This peer does exactly what peer (c) does,
frame for frame and command for command, on the stack deskbridge must use: the gap
between it and peer (c) is the stack's, the gap between deskbridge and it is deskbridge's
own (recovery, deadlines, idempotency, supersede, bounded connections, pacing).

Hub (this file): verifies the token on the upgrade, reads ``hello``, SETs
``presence:{<user>}`` (PX 30 s, refreshed every 10 s) and answers ``welcome``. Per
connected user one relay task runs ``XREADGROUP GROUP g <consumer> COUNT 32 BLOCK 2000
STREAMS jobs:{<user>} >`` (coredis's pool lends a connection to each blocked reader)
and sends each entry as a ``job`` frame; the ``job_result`` is written with one MULTI:
RPUSH ``result:{<user>}:<job_id>``, EXPIRE 300 s, XACK.

Caller (:class:`TrioCaller`): GET presence (none -> offline), XADD ``jobs:{<user>}``
(MAXLEN ~ 500), BLPOP on the result list: 3 round trips; holder: the read plus 1.

What it guarantees and does not: as peer (c) (``streams_hub.py``'s docstring).

Usage: python bench/lib/trio_hub.py --port P --redis-url URL --secret S
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from typing import Any

import coredis
import trio
from coredis.exceptions import RedisError, ResponseError
from coredis.tokens import PureToken

# the same keys, group, timings and welcome frame as peer (c)
from bench.lib.streams_hub import (
    GROUP,
    HEARTBEAT_S,
    PRESENCE_MS,
    RESULT_TTL_S,
    _keys,
    welcome,
)

#: coredis's pool lends one connection per blocked XREADGROUP / BLPOP: as many as users.
MAX_CONNECTIONS = 100_000


class TrioHub:
    def __init__(self, redis: coredis.Redis[bytes], secret: str) -> None:
        self.redis = redis
        self.secret = secret
        self.consumer = f"bench-{os.getpid()}-{uuid.uuid4().hex[:6]}"

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                done = "startup" if message["type"] == "lifespan.startup" else "shutdown"
                await send({"type": f"lifespan.{done}.complete"})
                if done == "shutdown":
                    return
        if scope["type"] != "websocket":
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        from deskbridge_hub import TokenRejected, verify_token

        auth = dict(scope["headers"]).get(b"authorization", b"").decode()
        await receive()  # websocket.connect
        try:
            user = verify_token(auth.removeprefix("Bearer "), [self.secret])
        except TokenRejected:
            await send({"type": "websocket.close", "code": 1008})
            return
        await send({"type": "websocket.accept"})
        await self._serve(user, receive, send)

    async def _serve(self, user: str, receive: Any, send: Any) -> None:
        async def send_text(obj: dict) -> None:
            await send({"type": "websocket.send", "text": json.dumps(obj)})

        async def receive_text() -> str | None:
            message = await receive()
            if message["type"] != "websocket.receive":
                return None
            return message.get("text") or (message.get("bytes") or b"").decode()

        raw = await receive_text()
        if raw is None or json.loads(raw).get("type") != "hello":
            await send({"type": "websocket.close", "code": 1008})
            return
        presence, stream = _keys(user)
        session = uuid.uuid4().hex
        await self.redis.set(presence, session, px=PRESENCE_MS)
        try:
            await self.redis.xgroup_create(stream, GROUP, identifier="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        await send_text(welcome(session))
        pending: dict[str, tuple[bytes, str]] = {}  # delivery id -> (entry ID, job id)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._relay, send_text, user, pending)
                nursery.start_soon(self._heartbeat, presence, session)
                while (raw := await receive_text()) is not None:
                    frame = json.loads(raw)
                    kind = frame.get("type")
                    if kind == "job_result":
                        await self._result(user, frame, pending)
                    elif kind == "ping":
                        await send_text({"type": "pong", "nonce": frame["nonce"]})
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                if await self.redis.get(presence) == session.encode():
                    await self.redis.delete([presence])

    async def _result(self, user: str, frame: dict, pending: dict) -> None:
        target = pending.pop(frame["id"], None)
        if target is None:
            return
        entry_id, job_id = target
        ok = frame["ok"]
        body = {"ok": ok, "result" if ok else "error": frame.get("result" if ok else "error")}
        result_key = f"result:{{{user}}}:{job_id}"
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.rpush(result_key, [json.dumps(body)])
            pipe.expire(result_key, RESULT_TTL_S)
            pipe.xack(_keys(user)[1], GROUP, [entry_id])

    async def _heartbeat(self, presence: str, session: str) -> None:
        while True:
            await trio.sleep(HEARTBEAT_S)
            try:
                await self.redis.set(presence, session, px=PRESENCE_MS)
            except (OSError, RedisError) as exc:
                print(f"heartbeat failed: {exc!r}", flush=True)

    async def _relay(self, send_text: Any, user: str, pending: dict) -> None:
        _, stream = _keys(user)
        while True:
            try:
                reply = await self.redis.xreadgroup(
                    GROUP, self.consumer, streams={stream: ">"}, count=32, block=2000
                )
            except (OSError, RedisError) as exc:
                print(f"relay read failed: {exc!r}", flush=True)
                await trio.sleep(0.1)
                continue
            for entries in (reply or {}).values():
                for entry in entries:
                    fields = entry.field_values
                    delivery = uuid.uuid4().hex
                    job_id = fields[b"job_id"].decode()
                    pending[delivery] = (entry.identifier, job_id)
                    await send_text(
                        {
                            "type": "job",
                            "id": delivery,
                            "job_id": job_id,
                            "name": fields[b"name"].decode(),
                            "args": json.loads(fields[b"args"]),
                            "idempotency_key": job_id,
                            "deadline": float(fields[b"deadline"]),
                        }
                    )


class TrioCaller:
    """The caller side, on trio: ``await caller.call(user, name, args)``."""

    def __init__(self, redis: coredis.Redis[bytes]) -> None:
        self.redis = redis

    async def call(self, user: str, name: str, args: dict, timeout_s: float = 10.0) -> object:
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
        await self.redis.xadd(
            stream,
            fields,
            trim_strategy=PureToken.MAXLEN,
            trim_operator=PureToken.APPROXIMATELY,
            threshold=500,
        )
        reply = await self.redis.blpop([f"result:{{{user}}}:{job_id}"], timeout=timeout_s)
        if reply is None:
            raise TimeoutError(job_id)
        body = json.loads(reply[1])
        if not body["ok"]:
            raise RuntimeError(body["error"])
        return body["result"]


def client(url: str) -> coredis.Redis[bytes]:
    """coredis as a plain user would configure it for blocking commands: no stream
    timeout (a blocked read is not a dead connection), a pool as large as the population."""
    return coredis.Redis.from_url(url, stream_timeout=None, max_connections=MAX_CONNECTIONS)


async def main(args: argparse.Namespace) -> None:
    from hypercorn.config import Config
    from hypercorn.trio import serve

    config = Config()
    config.bind = [f"127.0.0.1:{args.port}"]
    config.accesslog = None
    config.websocket_ping_interval = None
    async with client(args.redis_url) as redis:
        await serve(TrioHub(redis, args.secret), config)  # type: ignore[arg-type]


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--redis-url", required=True)
    p.add_argument("--secret", default=os.environ.get("DESKBRIDGE_SECRET", ""))
    trio.run(main, p.parse_args())
