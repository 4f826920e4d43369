"""TLS end to end: a real ``deskbridge-hub serve --certfile --keyfile`` process and real
``deskbridge-sidecar run --hub wss://...`` processes, with a throwaway CA (trustme).

* with ``--ca-file`` the sidecar connects over wss:// and a call through https:// completes;
* without it (system trust store) the sidecar refuses the hub's certificate, never
  connects, says so in its log, and keeps retrying rather than falling back to anything;
* with the CA but the wrong host name it refuses too (the name is checked, not just the
  chain);
* the TLS port speaks no plaintext.

Every wait is bounded (``wait_until``); nothing sleeps as synchronisation.
"""

from __future__ import annotations

import secrets
import ssl
from pathlib import Path

import httpx
import pytest
import trustme

from tests.procs import API_KEY, Hub, Sidecar, issue, running, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")  # an IP SAN only: "localhost" must not match
    paths = {
        "ca": tmp_path / "ca.pem",
        "cert": tmp_path / "server-chain.pem",
        "key": tmp_path / "server-key.pem",
    }
    ca.cert_pem.write_to_path(str(paths["ca"]))
    server.private_key_pem.write_to_path(str(paths["key"]))
    with open(paths["cert"], "wb") as chain:
        for blob in server.cert_chain_pems:
            chain.write(blob.bytes())
    return paths


def _client(pki: dict[str, Path]) -> httpx.Client:
    trust = ssl.create_default_context(cafile=str(pki["ca"]))
    return httpx.Client(headers={"Authorization": f"Bearer {API_KEY}"}, verify=trust, timeout=30.0)


def test_sidecar_with_the_ca_connects_over_wss_and_a_call_completes(tmp_path, pki):
    user = "tls-" + secrets.token_hex(4)
    hub = Hub(tmp_path, workers=1, certfile=pki["cert"], keyfile=pki["key"], ca_file=pki["ca"])
    with running(hub):
        hub.wait_healthy()
        assert hub.ws.startswith("wss://") and hub.http.startswith("https://")
        sidecar = Sidecar(
            tmp_path, hub.ws, issue(user), extra_args=["--ca-file", str(pki["ca"])], name="ok"
        )
        with running(sidecar), _client(pki) as client:
            url = f"{hub.http}/v1/users/{user}"
            wait_until(
                lambda: client.get(url + "/presence").json()["online"],
                timeout_s=20,
                what=f"sidecar online over wss (log:\n{sidecar.output()[-2000:]})",
            )
            args = {"over": "tls", "nonce": secrets.token_hex(4)}
            r = client.post(url + "/jobs", json={"name": "echo", "args": args, "timeout_s": 20})
            assert r.status_code == 200, r.text
            assert r.json()["status"] == "completed" and r.json()["result"] == args


def test_sidecar_without_the_ca_refuses_the_certificate_and_never_connects(tmp_path, pki):
    user = "tls-" + secrets.token_hex(4)
    hub = Hub(tmp_path, workers=1, certfile=pki["cert"], keyfile=pki["key"], ca_file=pki["ca"])
    with running(hub):
        hub.wait_healthy()
        # the system trust store does not know our throwaway CA
        untrusting = Sidecar(tmp_path, hub.ws, issue(user), name="no-ca")
        with running(untrusting), _client(pki) as client:
            wait_until(
                lambda: untrusting.output().count("CERTIFICATE_VERIFY_FAILED") >= 2,
                timeout_s=30,
                what="two refused TLS handshakes in the sidecar log",
            )
            log = untrusting.output()
            assert "certificate verify failed" in log
            assert "connected to" not in log and "welcome" not in log.lower()
            assert untrusting.popen.poll() is None  # it keeps retrying, with backoff
            r = client.get(f"{hub.http}/v1/users/{user}/presence")
            assert r.json()["online"] is False


def test_sidecar_with_the_ca_but_the_wrong_host_name_is_refused(tmp_path, pki):
    """The certificate names 127.0.0.1 only; reaching the same socket as "localhost"
    fails host name verification even though the chain is trusted."""
    user = "tls-" + secrets.token_hex(4)
    hub = Hub(tmp_path, workers=1, certfile=pki["cert"], keyfile=pki["key"], ca_file=pki["ca"])
    with running(hub):
        hub.wait_healthy()
        wrong_name = hub.ws.replace("127.0.0.1", "localhost")
        sidecar = Sidecar(
            tmp_path, wrong_name, issue(user), extra_args=["--ca-file", str(pki["ca"])], name="dns"
        )
        with running(sidecar), _client(pki) as client:
            wait_until(
                lambda: "CERTIFICATE_VERIFY_FAILED" in sidecar.output(),
                timeout_s=30,
                what="a refused TLS handshake in the sidecar log",
            )
            assert "Hostname mismatch" in sidecar.output()
            assert client.get(f"{hub.http}/v1/users/{user}/presence").json()["online"] is False


def test_the_tls_port_speaks_no_plaintext(tmp_path, pki):
    hub = Hub(tmp_path, workers=1, certfile=pki["cert"], keyfile=pki["key"], ca_file=pki["ca"])
    with running(hub):
        hub.wait_healthy()
        plain = hub.http.replace("https://", "http://")
        with pytest.raises(httpx.HTTPError):
            httpx.get(plain + "/healthz", timeout=5.0)
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(hub.http + "/healthz", timeout=5.0)  # default trust: refused
