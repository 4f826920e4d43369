"""A job's state as one typed value: the transition table, the stored text, exactly.

Pure tests, no event loop and no substrate (issue 15: the delivery and outcome tests
exercise JobState only through the paths a job takes; these pin the value itself).
"""

from __future__ import annotations

import json

import pytest
from deskbridge_hub._jobstate import (
    MIXED,
    TRANSITIONS,
    InvalidTransition,
    JobState,
    MalformedState,
    Stage,
    check_transition,
    delivered_again,
)


def test_only_finished_cancelled_expired_and_lost_are_terminal():
    assert {s for s in Stage if s.terminal} == {
        Stage.FINISHED, Stage.CANCELLED, Stage.EXPIRED, Stage.LOST}


@pytest.mark.parametrize("old", list(Stage))
@pytest.mark.parametrize("new", list(Stage))
def test_check_transition_allows_exactly_the_table(old, new):
    if new in TRANSITIONS[old]:
        check_transition(old, new)
    else:
        with pytest.raises(InvalidTransition, match=f"^job stage {old} cannot become {new}$"):
            check_transition(old, new)


def test_a_terminal_stage_is_final():
    with pytest.raises(InvalidTransition):
        JobState(Stage.FINISHED, "u").advance(Stage.DELIVERED)
    state = JobState(Stage.QUEUED, "u")
    assert state.advance(Stage.LOST).stage is Stage.LOST


def test_advance_sets_the_stage_and_time_and_keeps_the_rest():
    queued = JobState("queued", "u", at=1.0, reply_to="box")
    assert queued.stage is Stage.QUEUED  # converted from its text
    delivered = queued.advance(Stage.DELIVERED, at=2.0, session_id="s1")
    assert delivered == JobState(Stage.DELIVERED, "u", at=2.0, session_id="s1", reply_to="box")
    # no new session: the one it was delivered on is kept; no time given: none is known
    assert delivered.advance(Stage.FINISHED) == JobState(
        Stage.FINISHED, "u", at=None, session_id="s1", reply_to="box")
    redelivered = delivered.advance(Stage.DELIVERED, at=3.0, session_id="s2")
    assert redelivered.session_id == "s2"


def test_encode_writes_the_stored_text_exactly():
    assert JobState(Stage.QUEUED, "u").encode() == '{"stage":"queued","user_id":"u"}'
    full = JobState(Stage.DELIVERED, "u", at=1.5, session_id="s", reply_to="r", daemon_id="d")
    assert full.encode() == ('{"stage":"delivered","user_id":"u","at":1.5,"session_id":"s",'
                             '"reply_to":"r","daemon_id":"d"}')
    assert JobState(Stage.LOST, "u", at=0.0).encode() == '{"stage":"lost","user_id":"u","at":0.0}'


def test_decode_reads_what_encode_wrote_and_normalises_types():
    full = JobState(Stage.DELIVERED, "u", at=1.5, session_id="s", reply_to="r", daemon_id="d")
    assert JobState.decode(full.encode()) == full
    assert JobState.decode(full.encode().encode()) == full
    state = JobState.decode('{"stage":"expired","user_id":7,"at":"2"}')
    assert (state.stage, state.user_id, state.at) == (Stage.EXPIRED, "7", 2.0)
    assert isinstance(state.at, float)
    assert JobState.decode('{"stage":"queued","user_id":"u","at":null}').at is None


@pytest.mark.parametrize(
    "text",
    ["not json", "[1]", '{"user_id":"u"}', '{"stage":"queued"}', '{"stage":"gone","user_id":"u"}',
     '{"stage":"queued","user_id":"u","at":"soon"}', '{"stage":"queued","user_id":"u","at":[]}'],
)
def test_decode_refuses_what_is_not_a_job_state(text):
    with pytest.raises(MalformedState) as info:
        JobState.decode(text)
    assert str(info.value).startswith(f"not a job state: {text[:80]!r} (")
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_decode_quotes_at_most_80_characters_of_the_text():
    text = json.dumps({"stage": "x" * 200, "user_id": "u"})
    with pytest.raises(MalformedState) as info:
        JobState.decode(text)
    assert repr(text[:80]) in str(info.value) and repr(text[:81]) not in str(info.value)


@pytest.mark.parametrize(
    ("before", "mine", "recorded", "elsewhere"),
    [
        (None, "d1", "d1", False),  # the first delivery
        ("d1", "d1", "d1", False),  # the same desktop again
        ("d1", "d2", MIXED, True),  # another desktop
        (None, None, MIXED, True),  # forwarded before to one not known, and again
        ("d1", None, MIXED, True),
        (MIXED, "d1", MIXED, True),  # mixed stays mixed
        (MIXED, MIXED, MIXED, True),
    ],
)
def test_a_delivery_records_its_desktop_or_mixed_once_an_earlier_went_elsewhere(
    before, mine, recorded, elsewhere
):
    state = JobState(Stage.DELIVERED, "u", session_id="s2", daemon_id=mine)
    first = (before, mine) == (None, "d1")
    sent = None if first else JobState(Stage.INTERRUPTED, "u", daemon_id=before)
    got, went = delivered_again(sent, state)
    assert (got.daemon_id, went) == (recorded, elsewhere)
    assert (got.stage, got.session_id) == (Stage.DELIVERED, "s2")
