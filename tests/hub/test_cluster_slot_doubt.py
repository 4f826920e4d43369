"""A replica that does not hold the desktop's session reads its presence from a
Cluster slot that is migrating: the holder's beats (a script over the user's keys, split
between the two nodes) are held (``TRYAGAIN``), so the presence may lapse though the
desktop stays connected. The holder's own doubt (``_own_liveness``, per user) covers
only the holder; the reading replica has its own evidence: the slot redirected it
(ASK), refused it (``TRYAGAIN``) or moved (MOVED). An absent presence met so is looked at
again and then ``unavailable``, never ``offline`` (real local Cluster on ports of
``$DESKBRIDGE_TEST_CLUSTER_PORTS``)."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator

import pytest
import trio
from deskbridge_common import Timings
from deskbridge_hub import Bridge, RedisSubstrate
from deskbridge_hub._errors import SubstrateUnavailable
from deskbridge_hub._own_liveness import DOUBT_AFTER_S, own_liveness
from deskbridge_hub._redis_slots import key_slot
from deskbridge_hub._substrate import presence_key, tools_key

from tests.hub.test_redis_cluster import (
    ClusterRaw,
    _finish_migration,
    _start_migration,
    _url,
    running_cluster,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[int]]:
    with running_cluster(tmp_path_factory.mktemp("slot-doubt")) as (ports, _):
        yield ports


async def test_an_absent_presence_on_a_migrating_slot_is_unavailable_not_offline(
    cluster: list[int],
) -> None:
    """The user's slot MIGRATING with its presence moved to the new node and its other
    keys left on the old one; the presence lapsed there (the holder's beats, a script
    over both sides, were held). Another replica (no session of this user, so no doubt
    of its own beats) reads it: the read was redirected (ASK), so ``unavailable``. Was:
    ``offline`` (the desktop is connected to the holder). Once the migration ended and
    the doubt's time passed, a really absent presence is ``offline`` again."""
    raw = ClusterRaw(cluster)
    user = f"slot-{secrets.token_hex(4)}"
    slot = key_slot(presence_key(user))
    s = RedisSubstrate.from_url(_url(cluster))
    with trio.fail_after(60):
        async with s:
            bridge = Bridge(s, Timings(), wall_clock=lambda: 0.0)
            await s.set_catalogue(user, '[{"name": "echo", "args_schema": {}}]')
            await s.set_presence(user, "session-without-holder", 30)
            assert (await bridge.presence(user)).online
            ids, source, target = await _start_migration(raw, slot, cluster)
            await raw("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS",
                      presence_key(user), port=source)  # fmt: skip
            assert await raw("EXISTS", tools_key(user), port=source) == 1
            # the holder's beats are held: its presence lapses on the new node
            await raw("ASKING", port=target)
            await raw("DEL", presence_key(user), port=target)
            assert not own_liveness().in_doubt(user)  # no session of this user here
            with pytest.raises(SubstrateUnavailable):
                await bridge.presence(user)
            await _finish_migration(raw, slot, ids, source, target, cluster)
            with contextlib.suppress(SubstrateUnavailable):  # MOVED: the doubt again
                await bridge.presence(user)
            await trio.sleep(DOUBT_AFTER_S + 0.5)
            assert not (await bridge.presence(user)).online  # the doubt ended: offline
    await raw("DEL", presence_key(user), tools_key(user))
