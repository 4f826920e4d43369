"""Revoking a user's tokens with real processes: a hub of two workers on Redis, a real
sidecar connected, ``deskbridge-hub revoke USER`` run as an operator would. The worker
holding the socket closes it with 4003 and a reason saying the token was revoked, the
sidecar's reconnect is refused (401) and it stops (exit 2, as for any refused token), the
old token stays refused, and a token issued after the revocation connects and works."""

from __future__ import annotations

import os
import re
import secrets
import subprocess

import pytest

from tests.procs import (
    BIN,
    Hub,
    Sidecar,
    api,
    hub_env,
    issue,
    log_text,
    raw_upgrade,
    running,
    wait_log,
    wait_until,
)

pytestmark = pytest.mark.integration


def _online(client, hub: Hub, user: str) -> str:
    return wait_until(
        lambda: client.get(f"{hub.http}/v1/users/{user}/presence").json().get("session_id"),
        timeout_s=30,
        what=f"{user} online",
    )


def test_revoke_cuts_the_live_session_refuses_its_token_and_takes_a_new_one(tmp_path):
    user = "revoke-" + secrets.token_hex(4)
    hub = Hub(tmp_path, workers=2)
    with running(hub):
        hub.wait_healthy()
        old = issue(user)
        sidecar = Sidecar(tmp_path, hub.ws, old)
        with running(sidecar), api() as client:
            session = _online(client, hub, user)
            done = subprocess.run(
                [str(BIN / "deskbridge-hub"), "revoke", user],
                env={**os.environ, **hub_env()},  # PYTHONPATH: the code under test
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert done.returncode == 0, done.stderr
            assert user in done.stdout and session in done.stdout
            # the worker holding the socket closed it with 4003, saying why
            wait_log(hub, rf"session {re.escape(session)} of {user} ends: 4003 token revoked",
                     timeout_s=10)  # fmt: skip
            # the sidecar heard it, tried again, was refused, and stopped
            assert sidecar.popen.wait(timeout=30) == 2
            said = log_text(sidecar)
            assert re.search(r"code 4003: token revoked", said), said[-2000:]
            assert "401" in said and "revoked" in said.split("code 4003", 1)[1]
            status, body = raw_upgrade(hub, old)
            assert status == 401 and "revoked" in body
            # the directory says how it ended, the admin API what was revoked
            row = client.get(f"{hub.http}/v1/admin/users/{user}").json()
            assert row["end"]["code"] == 4003 and "revoked" in row["end"]["reason"]
            assert row["revoked"]["before"] <= row["revoked"]["at"] + 1
        fresh = Sidecar(tmp_path, hub.ws, issue(user), name="sidecar-new")
        with running(fresh), api() as client:
            _online(client, hub, user)
            r = client.post(
                f"{hub.http}/v1/users/{user}/jobs", json={"name": "echo", "args": {"x": 1}}
            )
            assert r.status_code == 200 and r.json()["result"] == {"x": 1}, r.text
