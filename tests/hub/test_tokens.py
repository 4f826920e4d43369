"""Sidecar tokens: what verify_token accepts, everything it refuses, rotation, the CLI.

Pure tests: no event loop, no sleeps (an expired token is issued in the past).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import jwt
import pytest
from deskbridge_hub import HubConfig, TokenRejected, issue_token, verify_token
from deskbridge_hub import cli as hub_cli
from deskbridge_hub._tokens import (
    DEFAULT_TOKEN_LIFETIME_S,
    MIN_SECRET_BYTES,
    TOKEN_LEEWAY_S,
    TokenExpired,
    TokenNotYetValid,
    key_id,
    verify_token_claims,
)
from hypothesis import given, settings
from hypothesis import strategies as st

# Secrets of at least 32 bytes (MIN_SECRET_BYTES, RFC 7518 section 3.2).
SECRET = "current-secret-0123456789abcdef-0123456789"
OLD_SECRET = "previous-secret-fedcba9876543210-fedcba98"
OTHER_SECRET = "somebody-elses-secret-000000000000000000"


def _b64(obj: object) -> str:
    raw = json.dumps(obj, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _hand_signed(header: dict, claims: dict, secret: str, digest=hashlib.sha256) -> str:
    """A compact JWT built without PyJWT (which refuses short keys and odd headers)."""
    signing_input = f"{_b64(header)}.{_b64(claims)}"
    sig = hmac.new(secret.encode(), signing_input.encode(), digest).digest()
    return f"{signing_input}.{base64.urlsafe_b64encode(sig).rstrip(b'=').decode()}"


def _claims(token: str) -> dict:
    return jwt.decode(token, options={"verify_signature": False})


def _rejected(token: str, secrets=(SECRET,)) -> str:
    with pytest.raises(TokenRejected) as info:
        verify_token(token, secrets)
    return str(info.value)


# -- what is accepted --------------------------------------------------------------------


def test_valid_token_gives_its_user_id():
    token = issue_token(SECRET, "alice@example.com", lifetime_s=60)
    assert verify_token(token, (SECRET,)) == "alice@example.com"


def test_token_header_and_claims_are_as_documented():
    token = issue_token(SECRET, "bob", lifetime_s=120, now=1_700_000_000.0)
    header = jwt.get_unverified_header(token)
    assert header["alg"] == "HS256"
    assert header["kid"] == hashlib.sha256(SECRET.encode()).hexdigest()[:16] == key_id(SECRET)
    assert _claims(token) == {"sub": "bob", "iat": 1_700_000_000, "exp": 1_700_000_120}


def test_default_lifetime_is_30_days():
    now = time.time()
    claims = _claims(issue_token(SECRET, "bob", now=now))
    assert claims["exp"] - claims["iat"] == 30 * 24 * 3600 == DEFAULT_TOKEN_LIFETIME_S


# -- what is refused ---------------------------------------------------------------------


def test_expired_token_is_refused_as_expired():
    token = issue_token(SECRET, "alice", lifetime_s=60, now=time.time() - 3600)
    with pytest.raises(TokenExpired):
        verify_token(token, (SECRET,))


def test_token_expiring_one_second_ago_is_refused_without_leeway():
    token = issue_token(SECRET, "alice", lifetime_s=10, now=time.time() - 12)
    with pytest.raises(TokenExpired):
        verify_token(token, (SECRET,), leeway_s=0)


# -- clock skew (issue 11 item 2): the minting machine's clock is not the hub's ----------


@pytest.mark.parametrize("ahead_s", [1, 5, 30, 299])
def test_token_minted_on_a_clock_ahead_within_the_leeway_is_valid_at_once(ahead_s):
    now = 1_800_000_000.0
    token = issue_token(SECRET, "alice", lifetime_s=3600, now=now + ahead_s)
    assert verify_token_claims(token, (SECRET,), now=now)[0] == "alice"


def test_token_minted_far_ahead_is_refused_as_not_yet_valid_which_is_transient():
    now = 1_800_000_000.0
    token = issue_token(SECRET, "alice", lifetime_s=3600, now=now + 400)
    with pytest.raises(TokenNotYetValid) as info:
        verify_token_claims(token, (SECRET,), now=now)
    assert info.value.valid_in_s == pytest.approx(100)
    assert "ahead" in str(info.value) and not isinstance(info.value, TokenExpired)


def test_default_leeway_is_five_minutes_on_exp_and_iat():
    assert TOKEN_LEEWAY_S == 300.0
    now = 1_800_000_000.0
    token = issue_token(SECRET, "alice", lifetime_s=60, now=now)
    # still accepted 299 s after exp by a hub whose clock runs ahead; refused at 300 s
    user, valid_until = verify_token_claims(token, (SECRET,), now=now + 60 + 299)
    assert (user, valid_until) == ("alice", now + 60 + TOKEN_LEEWAY_S)
    with pytest.raises(TokenExpired):
        verify_token_claims(token, (SECRET,), now=now + 60 + 300)


def test_leeway_is_configurable_and_validated():
    assert HubConfig.from_env({}).token_leeway_s == TOKEN_LEEWAY_S
    assert HubConfig.from_env({"DESKBRIDGE_TOKEN_LEEWAY_S": "30"}).token_leeway_s == 30.0
    for bad in ("-1", "nan", "inf", "soon"):
        with pytest.raises(ValueError, match="DESKBRIDGE_TOKEN_LEEWAY_S"):
            HubConfig.from_env({"DESKBRIDGE_TOKEN_LEEWAY_S": bad})


def test_forged_token_signed_with_another_secret_is_refused():
    forged = issue_token(OTHER_SECRET, "alice", lifetime_s=60)
    assert "unknown key" in _rejected(forged)


def test_forged_token_claiming_the_right_kid_fails_the_signature():
    claims = {"sub": "alice", "iat": int(time.time()), "exp": int(time.time()) + 60}
    forged = jwt.encode(claims, OTHER_SECRET, algorithm="HS256", headers={"kid": key_id(SECRET)})
    message = _rejected(forged)
    assert not isinstance(message, TokenExpired)
    assert "signature" in message.lower()


def test_tampered_payload_fails_the_signature():
    token = issue_token(SECRET, "alice", lifetime_s=60)
    header, _, sig = token.split(".")
    claims = _claims(token) | {"sub": "mallory"}
    assert "signature" in _rejected(f"{header}.{_b64(claims)}.{sig}").lower()


@pytest.mark.parametrize("kid", [None, "", "0000000000000000", key_id(SECRET)[:15], 12345])
def test_wrong_or_missing_kid_is_refused(kid):
    headers = {} if kid is None else {"kid": kid}
    claims = {"sub": "alice", "exp": int(time.time()) + 60}
    if isinstance(kid, int):  # PyJWT refuses to encode it; build the token by hand
        token = f"{_b64({'alg': 'HS256', 'typ': 'JWT', 'kid': kid})}.{_b64(claims)}.AAAA"
    else:
        token = jwt.encode(claims, SECRET, algorithm="HS256", headers=headers)
    _rejected(token)


@pytest.mark.parametrize("headers", [{}, {"kid": ""}], ids=["absent", "empty"])
def test_a_token_without_kid_says_so_and_what_the_hub_expects(headers):
    """Was "token signed with an unknown key" for a token signed with the hub's own
    secret by a tool that sets no ``kid``: the operator looked for a wrong secret."""
    claims = {"sub": "alice", "exp": int(time.time()) + 60}
    token = jwt.encode(claims, SECRET, algorithm="HS256", headers=headers)
    message = _rejected(token)
    assert "unknown key" not in message
    assert message.startswith("token has no kid header"), message
    assert "SHA-256" in message and "deskbridge-hub token" in message


@pytest.mark.parametrize("with_signature", [False, True])
def test_alg_none_is_refused(with_signature):
    claims = {"sub": "alice", "exp": int(time.time()) + 60}
    header = {"alg": "none", "typ": "JWT", "kid": key_id(SECRET)}
    signature = issue_token(SECRET, "alice").rsplit(".", 1)[1] if with_signature else ""
    assert "alg value is not allowed" in _rejected(f"{_b64(header)}.{_b64(claims)}.{signature}")


def test_other_hmac_algorithm_is_refused():
    claims = {"sub": "alice", "exp": int(time.time()) + 60}
    header = {"alg": "HS512", "typ": "JWT", "kid": key_id(SECRET)}
    token = _hand_signed(header, claims, SECRET, hashlib.sha512)
    assert "alg value is not allowed" in _rejected(token)


@pytest.mark.parametrize(
    "token",
    [
        "",
        "not-a-jwt",
        "a.b",
        "a.b.c.d",
        "...",
        "eyJhbGciOiJIUzI1NiJ9",
        "!!!!.????.####",
        _b64([1, 2, 3]) + "." + _b64({"sub": "a"}) + ".sig",
        _b64("just a string") + "." + _b64({"sub": "a"}) + ".sig",
        "\u00e9\u00e9\u00e9.\u00e9.\u00e9",
        "x" * 10_000,
    ],
)
def test_malformed_token_is_refused(token):
    _rejected(token)


@pytest.mark.parametrize("missing", ["sub", "exp"])
def test_token_missing_a_required_claim_is_refused(missing):
    claims = {"sub": "alice", "iat": int(time.time()), "exp": int(time.time()) + 60}
    del claims[missing]
    token = jwt.encode(claims, SECRET, algorithm="HS256", headers={"kid": key_id(SECRET)})
    assert missing in _rejected(token)


@pytest.mark.parametrize(
    "sub",
    ["", "a b", "a/b", "a{b}", "alice\n", "al*ce", "x" * 129, "\u00e9l\u00e8ve", 42, ["alice"]],
)
def test_user_id_with_bad_characters_is_refused(sub):
    """A validly signed token whose ``sub`` could not be a user id (it would reach a
    Redis key and log lines) is refused, even though the signature is good."""
    claims = {"sub": sub, "exp": int(time.time()) + 60}
    token = jwt.encode(claims, SECRET, algorithm="HS256", headers={"kid": key_id(SECRET)})
    with pytest.raises(TokenRejected) as info:
        verify_token(token, (SECRET,))
    assert not isinstance(info.value, TokenExpired)


@pytest.mark.parametrize("user_id", ["", "a b", "x" * 129, "a{b}"])
def test_issue_refuses_bad_user_ids(user_id):
    with pytest.raises(ValueError, match="user_id"):
        issue_token(SECRET, user_id)


@pytest.mark.parametrize(
    ("secret", "lifetime_s", "needle"),
    [
        ("", 60.0, "empty"),
        ("s" * (MIN_SECRET_BYTES - 1), 60.0, "at least 32"),
        (SECRET, 0.0, "lifetime_s"),
        (SECRET, -1.0, "lifetime_s"),
        (SECRET, float("nan"), "lifetime_s"),
        (SECRET, float("inf"), "lifetime_s"),
    ],
)
def test_issue_refuses_bad_secret_and_lifetime(secret, lifetime_s, needle):
    with pytest.raises(ValueError, match=needle) as info:
        issue_token(secret, "alice", lifetime_s=lifetime_s)
    if secret:
        assert secret not in str(info.value)  # never echo a secret


def test_short_secret_is_never_used_to_verify():
    """A hub misconfigured with a short secret refuses every token (and says why in its
    log) instead of accepting tokens an attacker could brute-force."""
    short = "s" * (MIN_SECRET_BYTES - 1)
    claims = {"sub": "alice", "exp": int(time.time()) + 60}
    token = _hand_signed({"alg": "HS256", "typ": "JWT", "kid": key_id(short)}, claims, short)
    assert "32 bytes" in _rejected(token, (short,))


def test_no_secrets_configured_refuses_everything():
    _rejected(issue_token(SECRET, "alice"), secrets=())
    _rejected(issue_token(SECRET, "alice"), secrets=("",))


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.text(max_size=300),
        st.lists(st.text(alphabet="ABCDEFabcdef0123456789-_=", max_size=60), max_size=5).map(
            ".".join
        ),
        st.tuples(
            st.dictionaries(
                st.sampled_from(["alg", "kid", "typ", "crit", "jku"]),
                st.one_of(st.none(), st.integers(), st.text(max_size=20), st.lists(st.integers())),
            ),
            st.dictionaries(
                st.sampled_from(["sub", "exp", "iat", "nbf", "aud"]),
                st.one_of(st.none(), st.integers(), st.floats(), st.text(max_size=20)),
            ),
            st.text(alphabet="ABCDEFabcdef0123456789-_", max_size=50),
        ).map(lambda t: f"{_b64(t[0])}.{_b64(t[1])}.{t[2]}"),
    )
)
def test_any_input_gives_a_user_id_or_token_rejected(token):
    """verify_token never lets another exception escape (the handshake would 500)."""
    try:
        user_id = verify_token(token, (SECRET, OLD_SECRET))
    except TokenRejected:
        return
    raise AssertionError(f"accepted a token nobody issued: {token!r} -> {user_id!r}")


# -- rotation ----------------------------------------------------------------------------


def test_rotation_previous_secret_accepted_while_listed_then_refused():
    old_token = issue_token(OLD_SECRET, "alice", lifetime_s=3600)
    new_token = issue_token(SECRET, "alice", lifetime_s=3600)

    during = HubConfig.from_env(
        {"DESKBRIDGE_SECRET": SECRET, "DESKBRIDGE_PREVIOUS_SECRETS": f" {OLD_SECRET} ,"}
    )
    assert during.secrets == (SECRET, OLD_SECRET)
    assert verify_token(old_token, during.secrets) == "alice"
    assert verify_token(new_token, during.secrets) == "alice"

    after = HubConfig.from_env({"DESKBRIDGE_SECRET": SECRET})
    assert after.secrets == (SECRET,)
    assert "unknown key" in _rejected(old_token, after.secrets)
    assert verify_token(new_token, after.secrets) == "alice"


def test_rotation_a_retired_secret_cannot_be_used_by_claiming_the_current_kid():
    """Removing a secret really revokes it: re-labelling an old-secret token with the
    current secret's kid only sends it to a signature check it fails."""
    claims = {"sub": "alice", "exp": int(time.time()) + 60}
    token = jwt.encode(claims, OLD_SECRET, algorithm="HS256", headers={"kid": key_id(SECRET)})
    assert "signature" in _rejected(token, (SECRET,)).lower()


# -- the CLI -----------------------------------------------------------------------------


def test_cli_token_issues_a_token_with_the_requested_lifetime(monkeypatch, capsys):
    monkeypatch.setenv("DESKBRIDGE_SECRET", SECRET)
    assert hub_cli.main(["token", "carol", "--lifetime-s", "90"]) == 0
    out, err = capsys.readouterr()
    token = out.strip()
    assert err == "" and out.count("\n") == 1
    claims = _claims(token)
    assert claims["sub"] == "carol"
    assert claims["exp"] - claims["iat"] == 90
    assert abs(claims["iat"] - time.time()) < 60
    assert jwt.get_unverified_header(token)["kid"] == key_id(SECRET)
    assert verify_token(token, (SECRET,)) == "carol"


def test_cli_token_default_lifetime_is_30_days(monkeypatch, capsys):
    monkeypatch.setenv("DESKBRIDGE_SECRET", SECRET)
    assert hub_cli.main(["token", "carol"]) == 0
    claims = _claims(capsys.readouterr().out.strip())
    assert claims["exp"] - claims["iat"] == 30 * 24 * 3600


@pytest.mark.parametrize("lifetime", ["0", "-5", "inf", "nan", "1e300", "315360001"])
def test_cli_token_bad_lifetime_names_the_option(monkeypatch, capsys, lifetime):
    monkeypatch.setenv("DESKBRIDGE_SECRET", SECRET)
    assert hub_cli.main(["token", "carol", f"--lifetime-s={lifetime}"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "--lifetime-s must be a positive" in err


def test_cli_token_without_secret_exits_2(monkeypatch, capsys):
    monkeypatch.delenv("DESKBRIDGE_SECRET", raising=False)
    assert hub_cli.main(["token", "carol"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "DESKBRIDGE_SECRET" in err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [(["token", "bad user"], "user_id"), (["token", "carol", "--lifetime-s", "0"], "lifetime")],
)
def test_cli_token_refuses_bad_input_with_exit_2(monkeypatch, capsys, argv, needle):
    monkeypatch.setenv("DESKBRIDGE_SECRET", SECRET)
    assert hub_cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and needle in err


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"DESKBRIDGE_SECRET": "too-short"}, "DESKBRIDGE_SECRET is 9 bytes"),
        (
            {"DESKBRIDGE_SECRET": SECRET, "DESKBRIDGE_PREVIOUS_SECRETS": "old-and-short"},
            "DESKBRIDGE_PREVIOUS_SECRETS",
        ),
        ({"DESKBRIDGE_SECRET": ""}, "DESKBRIDGE_SECRET is not set"),
    ],
)
def test_cli_serve_refuses_a_missing_or_short_secret(monkeypatch, capsys, env, needle):
    """Checked before Hypercorn starts: the command returns 2 and says why."""
    for name in ("DESKBRIDGE_PREVIOUS_SECRETS", "DESKBRIDGE_REDIS_URL", "DESKBRIDGE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert hub_cli.main(["serve", "--bind", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert "too-short" not in err and "old-and-short" not in err  # never echo a secret
