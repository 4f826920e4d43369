from __future__ import annotations

import pytest
from deskbridge_common import Timings


def test_defaults_are_the_field_tested_values():
    t = Timings()
    # the heartbeat is the field's 10 s x 3 (issue 10: idle desktops cost little)
    assert (t.heartbeat_s, t.presence_ttl_s, t.jobs_maxlen) == (30.0, 90.0, 500)
    assert (t.reclaim_idle_s, t.result_ttl_s, t.call_timeout_s) == (180.0, 300.0, 90.0)
    assert (t.dedupe_size, t.dedupe_ttl_s, t.wedge_gap_s) == (256, 300.0, 5.0)
    assert t.presence_ttl_s == 3 * t.heartbeat_s


def test_every_field_reads_its_environment_variable():
    t = Timings()
    env = {var: "7" for var in t.env_names().values()}
    env["DESKBRIDGE_PRESENCE_TTL_S"] = "21"
    loaded = Timings.from_env(env)
    for name in t.env_names():
        assert getattr(loaded, name) == (21 if name == "presence_ttl_s" else 7)


def test_int_fields_stay_int():
    assert Timings.from_env({"DESKBRIDGE_JOBS_MAXLEN": "42"}).jobs_maxlen == 42
    assert isinstance(Timings.from_env({"DESKBRIDGE_JOBS_MAXLEN": "42"}).jobs_maxlen, int)


@pytest.mark.parametrize("raw", ["abc", "-1", "0", "inf", "nan", "-inf"])
def test_bad_values_name_the_variable(raw):
    with pytest.raises(ValueError, match="DESKBRIDGE_RECLAIM_IDLE_S"):
        Timings.from_env({"DESKBRIDGE_RECLAIM_IDLE_S": raw})


def test_presence_ttl_must_outlive_the_heartbeat():
    with pytest.raises(ValueError, match="DESKBRIDGE_PRESENCE_TTL_S"):
        Timings.from_env({"DESKBRIDGE_PRESENCE_TTL_S": "25"})  # heartbeat stays 30


def test_a_heartbeat_past_the_presence_ttl_names_the_heartbeat_variable_too():
    """A newcomer pass: DESKBRIDGE_HEARTBEAT_S=1000 alone was refused as
    "DESKBRIDGE_PRESENCE_TTL_S: ...", a variable nobody had set; the ordering names both."""
    with pytest.raises(ValueError) as refused:
        Timings.from_env({"DESKBRIDGE_HEARTBEAT_S": "1000"})
    assert str(refused.value).startswith(
        "DESKBRIDGE_PRESENCE_TTL_S and DESKBRIDGE_HEARTBEAT_S: presence_ttl_s (90) must "
        "exceed heartbeat_s (1000)"
    )


@pytest.mark.parametrize("name", ["grace_s", "heartbeat_s", "result_ttl_s", "ping_timeout_s"])
def test_an_infinite_timing_is_refused_with_its_variable_named(name):
    """DESKBRIDGE_GRACE_S=inf started a hub whose drain never gave up (a newcomer pass):
    every timing is a positive finite number."""
    var = "DESKBRIDGE_" + name.upper()
    env = {var: "inf"}
    if name == "heartbeat_s":
        env["DESKBRIDGE_PRESENCE_TTL_S"] = "1e9"  # not the ordering check that refuses it
    with pytest.raises(ValueError, match=f"^{var}: {name} must be a positive finite number"):
        Timings.from_env(env)


@pytest.mark.parametrize("name", ["DESKBRIDGE_CALL_TIMEOUT_S", "DESKBRIDGE_GRACE_S"])
@pytest.mark.parametrize("value", ["86401", "1e300"])
def test_waits_are_bounded_as_every_other_way_in_bounds_them(name, value):
    """A default call timeout over a day made every call without its own ``timeout_s`` a
    400 naming a field the caller never sent; a grace of 1e300 s was the drain that never
    gave up which ``serve --graceful-timeout-s`` refuses."""
    with pytest.raises(ValueError, match=name):
        Timings.from_env({name: value})
    assert Timings.from_env({name: "86400"})  # a day is taken


@pytest.mark.parametrize("name", [f.name for f in __import__("attrs").fields(Timings)])
def test_every_timing_has_an_upper_bound_named_in_its_error(name):
    """A newcomer pass: DESKBRIDGE_RESULT_TTL_S=1e30 (or DESKBRIDGE_READ_BLOCK_MS=1e20)
    started a hub whose every sidecar handshake ended 1011 with a traceback (Redis:
    "value is not an integer or out of range"). Each knob is bounded, and the refusal
    names the variable and what is accepted."""
    var = "DESKBRIDGE_" + name.upper()
    with pytest.raises(ValueError, match=f"^{var}: {name} must be at most [0-9,]+"):
        Timings.from_env({var: "99999999999999999999"})


@pytest.mark.parametrize("name", ["jobs_maxlen", "read_block_ms", "dedupe_size"])
def test_a_fraction_for_a_whole_number_timing_says_so(name):
    """DESKBRIDGE_JOBS_MAXLEN=1.5 said "is not a number"; it is one, just not whole."""
    var = "DESKBRIDGE_" + name.upper()
    with pytest.raises(ValueError, match=f"^{var}='1.5' is not a whole number"):
        Timings.from_env({var: "1.5"})
