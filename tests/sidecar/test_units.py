"""Pure pieces: the dedupe cache, backoff, the clock watchdog, URLs, outcomes."""

from __future__ import annotations

import random

import pytest
import trio
from deskbridge_common import decode_frame, encode_frame
from deskbridge_sidecar import (
    Backoff,
    ClockGap,
    DedupeCache,
    Outcome,
    sidecar_url,
    watch_clocks,
)
from hypothesis import given
from hypothesis import strategies as st

# -- dedupe cache ----------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_dedupe_expires_after_ttl():
    clock = FakeClock()
    cache = DedupeCache(size=256, ttl_s=300.0, clock=clock)
    cache.put("k", Outcome.success(1))
    clock.now = 299.9
    assert cache.get("k") == Outcome.success(1)  # reading does not refresh
    clock.now = 300.0
    assert cache.get("k") is None and len(cache) == 0


def test_dedupe_size_bound_is_lru_by_insertion():
    clock = FakeClock()
    cache = DedupeCache(size=3, ttl_s=300.0, clock=clock)
    for key in "abc":
        cache.put(key, Outcome.success(key))
    assert cache.get("a") is not None  # a read does not move "a" to the back
    cache.put("d", Outcome.success("d"))
    assert "a" not in cache and all(k in cache for k in "bcd")
    assert cache.evictions == 1
    cache.put("b", Outcome.success("b2"))  # re-recording re-inserts at the back
    cache.put("e", Outcome.success("e"))
    assert "c" not in cache and cache.get("b") == Outcome.success("b2")


async def test_dedupe_defaults_to_the_trio_clock(autojump_clock):
    cache = DedupeCache()
    cache.put("k", Outcome.success(None))
    await trio.sleep(299)
    assert "k" in cache
    await trio.sleep(1)
    assert "k" not in cache


def test_dedupe_refuses_nonsense():
    with pytest.raises(ValueError):
        DedupeCache(size=0)


@pytest.mark.parametrize(("size", "ttl_s"), [(0, 300.0), (-1, 300.0), (256, 0.0), (256, -1.0)])
def test_dedupe_size_and_ttl_must_both_be_positive(size, ttl_s):
    with pytest.raises(ValueError, match="^DedupeCache size and ttl_s must be positive$"):
        DedupeCache(size=size, ttl_s=ttl_s)


def test_dedupe_of_one_holds_the_latest_outcome():
    clock = FakeClock()
    cache = DedupeCache(size=1, ttl_s=0.5, clock=clock)
    cache.put("a", Outcome.success("a"))
    assert cache.get("a") == Outcome.success("a") and len(cache) == 1 and cache.evictions == 0
    cache.put("b", Outcome.success("b"))
    assert cache.get("a") is None and cache.get("b") == Outcome.success("b")
    assert len(cache) == 1 and cache.evictions == 1


def test_dedupe_evictions_count_every_outcome_pushed_out_by_the_size_bound():
    cache = DedupeCache(size=1, ttl_s=300.0, clock=FakeClock())
    for n, key in enumerate("abcd"):
        cache.put(key, Outcome.success(key))
        assert cache.evictions == n  # one more per put past the bound, not "at least one"
    assert len(cache) == 1 and cache.get("d") == Outcome.success("d")


def test_dedupe_rerecording_a_key_replaces_it_without_evicting():
    clock = FakeClock()
    cache = DedupeCache(size=2, ttl_s=300.0, clock=clock)
    cache.put("a", Outcome.success(1))
    cache.put("b", Outcome.success(2))
    cache.put("a", Outcome.success(3))
    assert len(cache) == 2 and cache.evictions == 0 and cache.get("a") == Outcome.success(3)


def test_dedupe_expiry_is_not_an_eviction_and_counts_down_len():
    clock = FakeClock()
    cache = DedupeCache(size=3, ttl_s=10.0, clock=clock)
    cache.put("a", Outcome.success(1))
    clock.now = 5.0
    cache.put("b", Outcome.success(2))
    assert len(cache) == 2
    clock.now = 10.0
    assert len(cache) == 1 and "a" not in cache and "b" in cache
    clock.now = 15.0
    assert len(cache) == 0 and cache.evictions == 0


def test_dedupe_holds_only_string_keys():
    cache = DedupeCache(clock=FakeClock())
    cache.put("1", Outcome.success(1))
    assert "1" in cache and 1 not in cache and None not in cache


# -- backoff ---------------------------------------------------------------------------


def test_backoff_full_jitter_upper_edge_doubles_to_the_cap():
    backoff = Backoff(initial_s=1.0, max_s=30.0, random=lambda: 1.0)
    assert [backoff.next_delay() for _ in range(8)] == [1, 2, 4, 8, 16, 30, 30, 30]
    backoff.reset()
    assert backoff.next_delay() == 1.0


def test_backoff_lower_edge_is_zero():
    backoff = Backoff(random=lambda: 0.0)
    assert {backoff.next_delay() for _ in range(10)} == {0.0}


@given(
    seed=st.integers(0, 2**32),
    initial=st.floats(0.01, 5),
    cap=st.floats(5, 120),
    n=st.integers(1, 80),
)
def test_backoff_delays_stay_within_their_windows(seed, initial, cap, n):
    rng = random.Random(seed)
    backoff = Backoff(initial_s=initial, max_s=cap, random=rng.random)
    for attempt in range(n):
        window = min(cap, initial * 2**attempt)
        delay = backoff.next_delay()
        assert 0.0 <= delay <= window
    assert backoff.window_s() <= cap


def test_backoff_refuses_nonsense():
    with pytest.raises(ValueError):
        Backoff(initial_s=0)
    with pytest.raises(ValueError):
        Backoff(max_s=0)


def test_backoff_cap_below_the_first_window_caps_every_window():
    """DESKBRIDGE_BACKOFF_MAX_S=0.5 with the default first window crashed the sidecar
    with a traceback (issue 11 item 6); it now caps every window at 0.5 s."""
    backoff = Backoff(initial_s=1.0, max_s=0.25, random=lambda: 1.0)
    assert [backoff.next_delay() for _ in range(4)] == [0.25] * 4


# -- watchdog --------------------------------------------------------------------------


class JumpyWall:
    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return 1_700_000_000.0 + trio.current_time() + self.offset


async def _jump_later(wall: JumpyWall, at_s: float, by_s: float) -> None:
    await trio.sleep(at_s)
    wall.offset += by_s


async def test_watchdog_reports_a_wall_clock_jump(autojump_clock):
    wall = JumpyWall()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_jump_later, wall, 3.5, 12.0)
        gap = await watch_clocks(interval_s=1.0, gap_s=5.0, wall_clock=wall)
    assert gap == ClockGap(gap_s=12.0, clock="wall")
    assert trio.current_time() == 4.0
    assert gap.describe() == (
        "clock gap of 12.0 s (wall) — lid closed or loop wedged; reconnecting"
    )


async def test_watchdog_reports_a_monotonic_gap(autojump_clock):
    ticks = iter([0.0, 1.0, 2.0, 9.5])  # the loop was wedged for 6.5 s
    gap = await watch_clocks(
        interval_s=1.0, gap_s=5.0, wall_clock=lambda: 0.0, monotonic=lambda: next(ticks)
    )
    assert gap == ClockGap(gap_s=6.5, clock="monotonic")


async def test_watchdog_ignores_small_and_backward_jumps(autojump_clock):
    wall = JumpyWall()
    with trio.move_on_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_jump_later, wall, 2.5, 4.9)  # under the 5 s gap
            nursery.start_soon(_jump_later, wall, 10.5, -3600.0)  # NTP stepped back
            await watch_clocks(interval_s=1.0, gap_s=5.0, wall_clock=wall)
            pytest.fail("watchdog fired")


# -- URLs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given_url", "expected"),
    [
        ("ws://127.0.0.1:8080", "ws://127.0.0.1:8080/v1/sidecar"),
        ("ws://127.0.0.1:8080/", "ws://127.0.0.1:8080/v1/sidecar"),
        ("wss://hub.example/custom/path", "wss://hub.example/custom/path"),
        ("https://hub.example", "wss://hub.example/v1/sidecar"),
        ("http://h:1/?x=1", "ws://h:1/v1/sidecar?x=1"),
    ],
)
def test_sidecar_url(given_url, expected):
    assert sidecar_url(given_url) == expected


@pytest.mark.parametrize("bad", ["ftp://h", "h:8080", "ws://", ""])
def test_sidecar_url_refuses(bad):
    with pytest.raises(ValueError):
        sidecar_url(bad)


def test_sidecar_url_names_every_scheme_it_takes():
    # a newcomer pass: http:// is taken, but the refusal said "must start with ws:// or
    # wss://" only
    with pytest.raises(ValueError, match=r"ws://, wss://, http:// or https://, got 'ftp://h'"):
        sidecar_url("ftp://h")


@pytest.mark.parametrize("url", ["ws://user:pw@h:8080", "wss://token@hub.example"])
def test_sidecar_url_refuses_credentials_in_it(url):
    """A newcomer pass: ``ws://user:pw@host`` connected (the token authenticates; the
    user and password were sent nowhere) and logged the password in every "connecting
    to" line and the status file."""
    with pytest.raises(ValueError, match="user name or password") as refused:
        sidecar_url(url)
    assert "pw" not in str(refused.value) and "token@" not in str(refused.value)


def test_outcome_reply_uses_the_given_id():
    reply = decode_frame(encode_frame(Outcome.success({"a": 1}).reply("d-9")))
    assert (reply.id, reply.ok, reply.result, reply.error) == ("d-9", True, {"a": 1}, None)
    failure = Outcome.failure("tool_error", "x" * 5000)
    assert len(failure.error.message) == 2000
    assert failure.reply("d-1").error == failure.error


def test_a_one_mib_result_is_serialised_once_on_its_way_out(monkeypatch):
    """Issue 9: a 1 MiB result used to be encoded three times and parsed three times
    (normalise, size check, writer). Now: one json.dumps where the tool returns, none
    when the reply is encoded, no parse at all."""
    import json

    import deskbridge_common._codec as codec
    import deskbridge_sidecar._outcome as outcome_module
    from deskbridge_common import Connection, Hello, Job, Role, Welcome

    calls = {"dumps": 0, "loads": 0}

    class CountingJson:
        @staticmethod
        def dumps(*args, **kwargs):
            calls["dumps"] += 1
            return json.dumps(*args, **kwargs)

        @staticmethod
        def loads(*args, **kwargs):
            calls["loads"] += 1
            return json.loads(*args, **kwargs)

    hub, sidecar = Connection(Role.HUB), Connection(Role.SIDECAR)
    hub.receive(sidecar.send(Hello(1, "t")))
    sidecar.receive(hub.send(Welcome("s", 10, 10, 10)))
    sidecar.receive(hub.send(Job("d1", "j1", "big", {}, "k1", 1e10)))
    value = {"blob": "x" * (1024 * 1024 - 300)}
    monkeypatch.setattr(codec, "json", CountingJson)
    monkeypatch.setattr(outcome_module, "json", CountingJson)
    outcome = Outcome.success(value)
    assert outcome.ok
    first = sidecar.send(outcome.reply("d1"))
    assert calls == {"dumps": 2, "loads": 0}  # the result once, the small envelope once
    assert len(first) > 1024 * 1024 - 300
    monkeypatch.undo()
    assert decode_frame(first).result == value
