"""Token verification at its edges, and every refusal's exact words (issue 15).

The hub's clock is the ``now`` passed in, never PyJWT's: tokens here are stamped far from
the real time, so a check left to PyJWT's own clock turns a test red. Pure tests.
"""

from __future__ import annotations

import time

import jwt
import pytest
from deskbridge_hub._tokens import (
    MIN_SECRET_BYTES,
    TOKEN_LEEWAY_S,
    TokenExpired,
    TokenNotYetValid,
    TokenRejected,
    check_secret,
    issue_token,
    key_id,
    verify_token_claims,
)

SECRET = "current-secret-0123456789abcdef-0123456789"
PAST = 1_000_000_000.0  # 2001: long expired by the real clock
FUTURE = 4_000_000_000.0  # 2096: far ahead of the real clock


def _signed(claims: dict, secret: str = SECRET) -> str:
    return jwt.encode(claims, secret, algorithm="HS256", headers={"kid": key_id(secret)})


def _refusal(token: str, *, now: float | None = None, leeway_s: float = TOKEN_LEEWAY_S):
    with pytest.raises(TokenRejected) as info:
        verify_token_claims(token, (SECRET,), now=now, leeway_s=leeway_s)
    return info.value


def test_a_secret_of_exactly_the_minimum_length_is_usable():
    exact = "s" * MIN_SECRET_BYTES
    assert check_secret(exact) == exact
    token = issue_token(exact, "alice", now=PAST, lifetime_s=60)
    assert verify_token_claims(token, (exact,), now=PAST) == ("alice", PAST + 60 + TOKEN_LEEWAY_S)


def test_an_unusable_secret_is_refused_with_its_name_and_size_only():
    with pytest.raises(ValueError) as info:
        check_secret("", "MY_SECRET")
    assert str(info.value) == "MY_SECRET is empty: set it to sign tokens"
    with pytest.raises(ValueError) as info:
        check_secret("é" * 15, "MY_SECRET")  # 30 bytes of UTF-8, 15 characters
    assert str(info.value) == (
        "MY_SECRET is 30 bytes; it must be at least 32 "
        "(e.g. python3 -c 'import secrets; print(secrets.token_hex(32))')")
    assert check_secret("é" * 16) == "é" * 16  # 32 bytes, 16 characters


def test_a_bad_lifetime_is_refused_with_its_message():
    for bad in (0.0, float("nan")):
        with pytest.raises(ValueError) as info:
            issue_token(SECRET, "alice", lifetime_s=bad)
        assert str(info.value) == "lifetime_s must be a positive, finite number of seconds"


def test_the_hub_judges_exp_and_iat_on_its_own_clock_not_pyjwts():
    expired_long_ago = issue_token(SECRET, "alice", now=PAST, lifetime_s=60)
    assert verify_token_claims(expired_long_ago, (SECRET,), now=PAST + 30)[0] == "alice"
    minted_in_the_future = issue_token(SECRET, "alice", now=FUTURE, lifetime_s=60)
    assert verify_token_claims(minted_in_the_future, (SECRET,), now=FUTURE)[0] == "alice"


def test_the_leeway_also_covers_an_nbf_claim():
    now = time.time()
    token = _signed({"sub": "alice", "exp": int(now) + 3600, "nbf": int(now) + 100})
    assert verify_token_claims(token, (SECRET,), now=now)[0] == "alice"


def test_the_leeway_edges_on_iat_and_exp_are_exact():
    iat = int(FUTURE)
    token = _signed({"sub": "alice", "iat": iat, "exp": iat + 60})
    # minted exactly one leeway ahead: valid at once; a second more: not yet
    assert verify_token_claims(token, (SECRET,), now=iat - TOKEN_LEEWAY_S)[0] == "alice"
    error = _refusal(token, now=iat - TOKEN_LEEWAY_S - 4)
    assert isinstance(error, TokenNotYetValid)
    assert error.valid_in_s == 4.0
    assert str(error) == (
        "token issued 304 s in the future by this hub's clock, more than the 300 s leeway: "
        "the clock of the machine that minted it runs ahead")
    # valid until exp + leeway, exclusive
    assert verify_token_claims(token, (SECRET,), now=iat + 60 + 299.5)[1] == iat + 360.0
    error = _refusal(token, now=iat + 60 + TOKEN_LEEWAY_S)
    assert isinstance(error, TokenExpired)
    assert str(error) == "token expired 300 s ago (leeway 300 s)"


def test_with_no_leeway_a_token_is_valid_until_its_exp():
    token = _signed({"sub": "alice", "iat": int(PAST), "exp": int(PAST) + 60})
    assert verify_token_claims(token, (SECRET,), now=PAST + 59.9, leeway_s=0) == (
        "alice", PAST + 60)
    assert str(_refusal(token, now=PAST + 61, leeway_s=0)) == "token expired 1 s ago (leeway 0 s)"


@pytest.mark.parametrize("leeway_s", [-1.0, float("nan"), float("inf"), 3600.5])
def test_a_bad_leeway_is_a_caller_error(leeway_s):
    token = issue_token(SECRET, "alice", now=PAST)
    with pytest.raises(ValueError) as info:
        verify_token_claims(token, (SECRET,), now=PAST, leeway_s=leeway_s)
    assert str(info.value) == f"leeway_s must be a number of seconds in [0, 3600], got {leeway_s!r}"


def test_refusals_say_exactly_why():
    assert str(_refusal("not-a-jwt")) == (
        "malformed token: Not enough segments")
    other = issue_token("another-secret-0123456789abcdef-0123456789", "alice")
    assert str(_refusal(other)) == "token signed with an unknown key"
    assert str(_refusal(_signed({"sub": "alice"}))) == (
        'invalid token: Token is missing the "exp" claim')
    for name, bad in (("exp", True), ("exp", "soon"), ("iat", "x"), ("iat", False)):
        claims = {"sub": "alice", "exp": int(FUTURE), **{name: bad}}
        error = _refusal(_signed(claims), now=PAST)
        assert str(error) == f"invalid token: {name} is not a number"
        assert not isinstance(error, TokenExpired | TokenNotYetValid)


def test_a_float_exp_and_no_iat_are_accepted():
    token = _signed({"sub": "alice", "exp": PAST + 60.5})
    assert verify_token_claims(token, (SECRET,), now=PAST) == ("alice", PAST + 60.5 + 300)


def test_a_genuine_token_for_an_impossible_user_id_says_what_a_user_id_is():
    error = _refusal(_signed({"sub": "a b", "exp": int(FUTURE)}), now=PAST)
    assert str(error) == "user_id must be 1-128 characters of A-Z a-z 0-9 _ . @ : -"


def test_any_positive_lifetime_is_accepted_even_under_a_second():
    token = issue_token(SECRET, "alice", lifetime_s=0.5, now=PAST)
    assert jwt.decode(token, options={"verify_signature": False})["exp"] == int(PAST)
