"""Contract checks of results and progress beyond the round trips in ``_contract``: the
arguments' bounds, and that a progress stream expires (registered with ``_contract``)."""

from __future__ import annotations

import trio

from ._contract import SubstrateHarness, check


async def _refused(call: object, words: str) -> None:
    try:
        await call  # type: ignore[misc]
    except ValueError as exc:
        assert words in str(exc), str(exc)
    else:
        raise AssertionError(f"accepted what must raise ValueError ({words})")


@check
async def check_result_and_progress_waits_refuse_negative_times_and_accept_zero(
    h: SubstrateHarness,
) -> None:
    """``wait_result(timeout_s=0)`` and ``read_progress(block_ms=0)`` wait until there is
    something (here there is: they answer at once); a negative time is a ValueError."""
    s, user, job = h.substrate, h.user(), h.job()
    await s.publish_result(user, job, "done", ttl_s=30)
    await s.publish_progress(job, '{"progress": 1}', ttl_s=30)
    with trio.fail_after(3):
        assert await s.wait_result(user, job, timeout_s=0) == "done"
        assert [p for _, p in await s.read_progress(job, "0", block_ms=0)] == ['{"progress": 1}']
    await _refused(s.wait_result(user, job, timeout_s=-0.5), "must be >= 0, got -0.5")
    await _refused(s.read_progress(job, "0", block_ms=-1), "block_ms must be >= 0, got -1")


@check
async def check_progress_expires_after_its_ttl(h: SubstrateHarness) -> None:
    """Every ``publish_progress`` (re)sets the stream's TTL: a stream left alone for
    longer than its last TTL is gone."""
    s, job = h.substrate, h.job()
    await s.publish_progress(job, '{"progress": 1}', ttl_s=30)
    await s.publish_progress(job, '{"progress": 2}', ttl_s=0.2)
    await trio.sleep(0.4)
    assert await s.read_progress(job, "0", block_ms=1) == []
