"""The dispatch API and the Redis substrate use anyio only, so a caller on asyncio (an
agent backend that is not trio) can dispatch too. Real Redis."""

from __future__ import annotations

import asyncio
import secrets

from deskbridge_hub import Bridge, RedisSubstrate
from deskbridge_hub._jobs import result_payload


def test_bridge_dispatches_from_asyncio(redis_url):
    user = "aio-" + secrets.token_hex(4)

    async def main():
        async with RedisSubstrate.from_url(redis_url) as substrate:
            bridge = Bridge(substrate)
            offline = await bridge.dispatch(user, "echo", {})
            assert offline.status == "offline"
            await substrate.set_presence(user, "s1", 30)
            assert (await bridge.presence(user)).online

            async def fake_hub():  # consume the entry and answer it like a hub would
                while True:
                    entries = await substrate.read_new(user, "aio-hub", count=1, block_ms=100)
                    if entries:
                        fields = entries[0].fields
                        job_id = fields["job_id"]
                        await substrate.publish_result(
                            user,
                            job_id,
                            result_payload("completed", result={"ok": 1}),
                            ttl_s=30,
                            notify=fields["reply_to"],  # the caller process's mailbox
                        )
                        await substrate.ack(user, entries[0].entry_id)
                        return job_id

            hub = asyncio.ensure_future(fake_hub())
            outcome = await bridge.dispatch(user, "echo", {}, timeout_s=5)
            assert outcome.status == "completed" and outcome.result == {"ok": 1}
            job_id = await hub
            assert outcome.job_id == job_id
            await substrate.clear_presence(user, "s1")

    asyncio.run(main())
