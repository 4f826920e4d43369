"""The sidecar on a laptop whose only way out is an HTTP proxy: a real hub process, a real
``deskbridge-sidecar run`` process and a real ``CONNECT`` proxy (``connect_proxy.py``).

* with ``HTTP_PROXY`` the sidecar reaches a ws:// hub through the proxy (the proxy counted
  the tunnel) and a call completes;
* with ``HTTPS_PROXY`` and Basic credentials it reaches a wss:// hub; the proxy saw the
  hub's host in ``CONNECT`` and then only TLS (never the token);
* with wrong credentials the sidecar logs one line naming the proxy and 407, never the
  password, and stops (exit 2: a configuration error, not retried);
* ``NO_PROXY`` naming the hub's host bypasses the proxy.

Every wait is bounded (``wait_until``, ``Proc.stop``); ports are free ones.
"""

from __future__ import annotations

import secrets
import ssl
from pathlib import Path

import httpx
import pytest
import trustme

from tests.integration.connect_proxy import running_proxy
from tests.procs import API_KEY, Hub, Sidecar, api, issue, log_text, running, wait_until

pytestmark = pytest.mark.integration

#: NO_PROXY unset too unless a test sets it (``Sidecar`` clears the proxy variables)
_NO_PROXY_ENV = dict.fromkeys(("no_proxy", "NO_PROXY"), "")


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    hub = Hub(tmp_path_factory.mktemp("proxy-hub"), workers=1)
    with running(hub):
        hub.wait_healthy()
        yield hub


def _call_echo(client: httpx.Client, http: str, user: str, sidecar: Sidecar) -> None:
    url = f"{http}/v1/users/{user}"
    wait_until(
        lambda: client.get(url + "/presence").json()["online"],
        timeout_s=30,
        what=f"sidecar online (log:\n{sidecar.output()[-3000:]})",
    )
    args = {"nonce": secrets.token_hex(4)}
    r = client.post(url + "/jobs", json={"name": "echo", "args": args, "timeout_s": 20})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "completed" and r.json()["result"] == args


def test_a_sidecar_reaches_a_ws_hub_through_http_proxy(tmp_path: Path, hub: Hub) -> None:
    user = "proxy-" + secrets.token_hex(4)
    with running_proxy() as proxy:
        env = {**_NO_PROXY_ENV, "HTTP_PROXY": proxy.url}
        sidecar = Sidecar(tmp_path, hub.ws, issue(user), env=env)
        with running(sidecar), api() as client:
            _call_echo(client, hub.http, user, sidecar)
            assert proxy.tunnels == [f"127.0.0.1:{hub.port}"], sidecar.output()[-3000:]
        log = log_text(sidecar)
    assert f"through proxy {proxy.url} (HTTP_PROXY)" in log, log[-3000:]


def test_a_sidecar_reaches_a_wss_hub_through_https_proxy_with_basic_auth(tmp_path: Path) -> None:
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    ca_file, cert, key = tmp_path / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    server.private_key_pem.write_to_path(str(key))
    cert.write_bytes(b"".join(blob.bytes() for blob in server.cert_chain_pems))
    hub = Hub(tmp_path, workers=1, certfile=cert, keyfile=key, ca_file=ca_file)
    user = "proxy-tls-" + secrets.token_hex(4)
    token = issue(user)
    with running(hub), running_proxy(credentials=("alice", "pa:ss w@rd")) as proxy:
        hub.wait_healthy()
        env = {**_NO_PROXY_ENV, "https_proxy": proxy.url_with("alice", "pa%3Ass%20w%40rd")}
        sidecar = Sidecar(tmp_path, hub.ws, token, env=env, extra_args=["--ca-file", str(ca_file)])
        trust = ssl.create_default_context(cafile=str(ca_file))
        headers = {"Authorization": f"Bearer {API_KEY}"}
        with running(sidecar), httpx.Client(headers=headers, verify=trust, timeout=30) as client:
            _call_echo(client, hub.http, user, sidecar)
        assert proxy.tunnels == [f"127.0.0.1:{hub.port}"]
        # what the proxy sees: the CONNECT line with the hub's host, then TLS records only
        assert proxy.requests[0].startswith(f"CONNECT 127.0.0.1:{hub.port} HTTP/1.1".encode())
        assert token.encode() not in proxy.relayed and b"/v1/sidecar" not in proxy.relayed
        assert proxy.relayed[:1] == b"\x16"  # a TLS handshake record
    log = log_text(sidecar)
    assert "pa:ss" not in log and "pa%3Ass" not in log


def test_wrong_proxy_credentials_are_one_line_without_the_password_and_stop(
    tmp_path: Path, hub: Hub
) -> None:
    with running_proxy(credentials=("alice", "right")) as proxy:
        env = {**_NO_PROXY_ENV, "HTTP_PROXY": proxy.url_with("alice", "Wr0ngPassw0rd")}
        sidecar = Sidecar(tmp_path, hub.ws, issue("proxy-407"), env=env)
        with running(sidecar):
            wait_until(
                lambda: sidecar.popen.poll() is not None,
                timeout_s=30,
                what=f"the sidecar stops (log:\n{sidecar.output()[-3000:]})",
            )
        log = log_text(sidecar)
    assert sidecar.popen.returncode == 2, log[-3000:]
    assert proxy.refused == [407], log[-3000:]  # asked once: a wrong password is not retried
    assert "Wr0ngPassw0rd" not in log
    lines = [line for line in log.splitlines() if "407" in line]
    assert any(
        f"proxy http://alice:***@127.0.0.1:{proxy.port} (HTTP_PROXY)" in line
        and f"refused CONNECT 127.0.0.1:{hub.port}" in line
        for line in lines
    ), log[-3000:]


def test_no_proxy_naming_the_hub_bypasses_the_proxy(tmp_path: Path, hub: Hub) -> None:
    user = "proxy-bypass-" + secrets.token_hex(4)
    with running_proxy() as proxy:
        env = {**_NO_PROXY_ENV, "HTTP_PROXY": proxy.url, "NO_PROXY": "localhost, 127.0.0.1"}
        sidecar = Sidecar(tmp_path, hub.ws, issue(user), env=env)
        with running(sidecar), api() as client:
            _call_echo(client, hub.http, user, sidecar)
        assert proxy.tunnels == [] and proxy.requests == []
    assert "direct (NO_PROXY matches 127.0.0.1)" in log_text(sidecar)
