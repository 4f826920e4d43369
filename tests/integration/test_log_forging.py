"""A URL path cannot forge a hub log line: ``%0a``/``%0d`` in a path were decoded into
the text access log as line breaks (``... ERROR deskbridge.hub[1]: forged`` on a line of
its own), a 5,000-character path was logged in full, and the 404's message echoed the
decoded newline back. Real hub (``serve --workers 1``); JSON lines were right already."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import httpx
import pytest

from tests.procs import Hub, running, wait_until

pytestmark = pytest.mark.integration

FORGED = "2026-12-03%2015:00:00,000%20ERROR%20deskbridge.hub%5B1%5D:%20forged"


def test_a_path_with_line_breaks_is_one_escaped_text_line(tmp_path: Path) -> None:
    tag = secrets.token_hex(4)
    hub = Hub(tmp_path, workers=1)
    with running(hub), httpx.Client(timeout=10) as client:
        hub.wait_healthy()
        r = client.get(f"{hub.http}/v1/users/{tag}%0a{FORGED}%0d/presence")
        assert r.status_code == 401
        r = client.get(f"{hub.http}/nowhere-{tag}%0a{FORGED}")
        assert r.status_code == 404 and "\n" not in r.json()["error"]["message"]
        assert "\\n2026-12-03" in r.json()["error"]["message"]
        long_path = f"/long-{tag}-" + "a" * 5000
        assert client.get(hub.http + long_path).status_code == 404
        wait_until(lambda: long_path[:100] in hub.output(), timeout_s=10, what="long path line")
        lines = hub.output().splitlines()
    assert not [line for line in lines if "forged" in line and tag not in line]
    (presence,) = [line for line in lines if f"/v1/users/{tag}" in line]
    assert (
        f'"GET /v1/users/{tag}\\n2026-12-03 15:00:00,000 ERROR deskbridge.hub[1]: '
        'forged\\r/presence" 401' in presence
    )
    (long_line,) = [line for line in lines if f"/long-{tag}-" in line]
    assert len(long_line) < 1000 and 'more chars]" 404' in long_line


def test_json_lines_keep_the_path_as_sent(tmp_path: Path) -> None:
    tag = secrets.token_hex(4)
    hub = Hub(tmp_path, workers=1, env={"DESKBRIDGE_LOG_FORMAT": "json"})
    with running(hub), httpx.Client(timeout=10) as client:
        hub.wait_healthy()
        assert client.get(f"{hub.http}/v1/users/{tag}%0a{FORGED}/presence").status_code == 401

        def access() -> list[dict]:
            return [
                json.loads(line)
                for line in hub.output().splitlines()
                if line.startswith("{") and tag in line
            ]

        (rec,) = wait_until(access, timeout_s=10, what="access line")
        lines = hub.output().splitlines()
    assert (
        rec["path"]
        == f"/v1/users/{tag}\n2026-12-03 15:00:00,000 ERROR deskbridge.hub[1]: forged/presence"
    )
    assert not [line for line in lines if line.startswith("2026-12-03 15:00")]
