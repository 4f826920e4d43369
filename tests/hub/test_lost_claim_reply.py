"""A claim of a caller-chosen job id (SET NX) whose reply was lost: the claim stays
(Redis ran it), the call is answered ``unavailable`` (nothing enqueued). The same
request sent again (same id, user, tool, arguments and idempotency key, or none) is that
caller's own: it goes on as the first would have, never ``409 job_id_in_use`` for its own
claim. Another request naming the id is still refused. Real Redis behind a proxy that
drops one reply (``test_redis_resend.ReplyCutter``)."""

from __future__ import annotations

import secrets

import pytest
import trio
from deskbridge_hub import Bridge, JobIdInUse, SubstrateUnavailable
from deskbridge_hub._redis import RedisSubstrate
from deskbridge_hub._substrate import owner_key

from .test_redis_resend import reply_cutter

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("key", [None, "order-10-key"], ids=["no key", "key"])
async def test_a_retry_after_a_lost_claim_reply_is_not_refused_as_in_use(
    raw_redis, monkeypatch: pytest.MonkeyPatch, key: str | None
) -> None:
    """The claim (SET NX) of the caller's id ran and its reply was lost (the connection
    cut after Redis answered): the call is answered unavailable, the claim stays. The
    same request sent again (same id, tool, arguments, key) is that caller's own: it
    goes on (here: ``offline``, nothing enqueued), not ``409 job_id_in_use``."""
    user = f"claimcut-{secrets.token_hex(4)}"  # offline: no presence
    job = f"order-{secrets.token_hex(4)}"
    with trio.fail_after(20):
        async with reply_cutter() as proxy, RedisSubstrate.from_url(proxy.url()) as s:
            bridge = Bridge(s)
            assert await s.get_presence(user) is None  # the connection is reused now
            claim = s.claim_job_id

            async def cut_claim(*args, **kwargs):  # type: ignore[no-untyped-def]
                proxy.arm()
                return await claim(*args, **kwargs)

            monkeypatch.setattr(s, "claim_job_id", cut_claim)
            with pytest.raises(SubstrateUnavailable):
                await bridge.dispatch(user, "echo", {"n": 1}, job_id=job, idempotency_key=key)
            monkeypatch.undo()
            assert proxy.cut == 1
            assert await raw_redis("EXISTS", owner_key(job)) == 1  # Redis ran the claim
            with pytest.raises(JobIdInUse):  # another request naming the id is still refused
                await bridge.dispatch(user, "echo", {"n": 2}, job_id=job, idempotency_key=key)
            try:
                again = await bridge.dispatch(
                    user, "echo", {"n": 1}, job_id=job, idempotency_key=key
                )
            except JobIdInUse:  # was: for the caller's own claim
                pytest.fail("the same request was refused as job_id_in_use")
            assert (again.job_id, again.status) == (job, "offline")


def test_the_owner_record_keeps_its_request_through_the_answered_mark() -> None:
    from deskbridge_hub._substrate_values import ANSWERED_MARK, JobOwner

    owner = JobOwner("u1", "box", request="ab12")
    assert JobOwner.decode(owner.encode()) == owner
    # the answer's write appends the mark in Lua (``_redis_finish._ANSWER_OWNER``)
    answered = JobOwner.decode(owner.encode() + ANSWERED_MARK)
    assert answered == JobOwner("u1", "box", True, request="ab12")
    assert JobOwner.decode("u1 box") == JobOwner("u1", "box")  # an older hub's record
    assert JobOwner.decode("u1 =ab12").reply_to is None
