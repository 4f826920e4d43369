"""Which commands block their connection and their polling form (pure, no I/O)."""

from __future__ import annotations

import pytest
from deskbridge_hub._redis_blocking import block_s, poll_form, poll_reply, with_block_s

XRG = (b"XREADGROUP", b"GROUP", "bridge-workers", "hub-1", b"COUNT", 10)


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ((b"GET", "k"), False),
        ((b"EVAL", "return 1", 0), False),
        ((b"BLPOP", "k", "1.500"), 1.5),
        ((b"BLPOP", "k", "0"), None),
        (("blpop", "k", 2), 2.0),
        ((b"BLMPOP", "0.25", 1, "k", b"LEFT"), 0.25),
        ((*XRG, b"STREAMS", "s", ">"), False),
        ((*XRG, b"BLOCK", 2000, b"STREAMS", "s", ">"), 2.0),
        ((*XRG, b"BLOCK", 0, b"STREAMS", "s", ">"), None),
        # a consumer or group named BLOCK is not the option
        ((b"XREADGROUP", b"GROUP", "BLOCK", "BLOCK", b"STREAMS", "s", ">"), False),
        # a stream named BLOCK after STREAMS is not the option
        ((b"XREAD", b"STREAMS", "BLOCK", "0"), False),
        ((b"WAIT", 1, 100), 0.1),
    ],
)
def test_block_time(command: tuple, expected: float | None | bool) -> None:
    assert block_s(command) == expected


def test_poll_forms_answer_in_the_blocking_shape() -> None:
    assert poll_form((b"BLPOP", "k", "1.000")) == (b"LPOP", "k")
    assert poll_reply((b"BLPOP", "k", "1.000"), "v") == ["k", "v"]
    assert poll_reply((b"BLPOP", "k", "1.000"), None) is None
    read = (*XRG, b"BLOCK", 2000, b"STREAMS", "s", ">")
    assert poll_form(read) == (*XRG, b"STREAMS", "s", ">")
    assert poll_form((b"BLMPOP", "1", 1, "k", b"LEFT")) == (b"LMPOP", 1, "k", b"LEFT")
    assert poll_form((b"BLPOP", "k1", "k2", "1")) is None  # which key answered is lost
    assert poll_form((b"WAIT", 1, 100)) is None


def test_with_block_never_turns_a_short_wait_into_forever() -> None:
    assert with_block_s((b"BLPOP", "k", "30"), 0.0001) == (b"BLPOP", "k", "0.001")
    assert with_block_s((b"BLPOP", "k", "30"), 1.2344) == (b"BLPOP", "k", "1.235")
    read = (*XRG, b"BLOCK", 2000, b"STREAMS", "s", ">")
    assert with_block_s(read, 0.0001) == (*XRG, b"BLOCK", 1, b"STREAMS", "s", ">")
    with pytest.raises(ValueError):
        with_block_s((b"GET", "k"), 1)
