"""The bare ASGI entry (``hypercorn -k trio deskbridge_hub.asgi:app``, as the README
shows) holds the signing secrets to ``serve``'s rule: at least 32 bytes each. It took any
secret: every user holds a token signed with it, so a short secret could be found offline
from one's own token, and with it tokens minted for any other user."""

from __future__ import annotations

import pytest
from deskbridge_hub._startup import load_config

GOOD = "s" * 32


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"DESKBRIDGE_SECRET": "secret"}, "DESKBRIDGE_SECRET"),
        (
            {"DESKBRIDGE_SECRET": GOOD, "DESKBRIDGE_PREVIOUS_SECRETS": "old"},
            "DESKBRIDGE_PREVIOUS_SECRETS",
        ),
    ],
)
def test_the_asgi_entry_refuses_a_short_secret_in_one_line(capsys, env, named):
    with pytest.raises(SystemExit) as exited:
        load_config({"DESKBRIDGE_REDIS_URL": "memory://", **env})
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert named in err and "at least 32" in err and err.count("\n") == 1
    assert "secret\n" not in err and "'old'" not in err  # never the secret itself


def test_a_long_secret_and_no_secret_still_start():
    assert load_config({"DESKBRIDGE_REDIS_URL": "memory://", "DESKBRIDGE_SECRET": GOOD}).secrets
    assert load_config({"DESKBRIDGE_REDIS_URL": "memory://"}).secrets == ()
