"""The query options of ``DESKBRIDGE_REDIS_URL`` are checked with the rest of the URL,
before anything connects (docs/operations.md, "Redis URL").

coredis ignores a query option it does not know and turns a bad TLS option into an
exception while the app starts: a typo (``ssl_cert_req=required``) left certificate
checks at ``optional`` without a word, ``ssl_*`` on a plain ``redis://`` silently used
no TLS, and a misspelt value or a missing CA file was a lifespan traceback, exit 1.
"""

from __future__ import annotations

import pytest
from deskbridge_hub._config import redis_url_problem


@pytest.mark.parametrize(
    ("url", "message"),
    [
        # a misspelt option: ignored, so verification stayed at the library's "optional"
        (
            "rediss://h:6380/0?ssl_cert_req=required",
            "unknown option 'ssl_cert_req' (rediss:// takes ssl_ca_certs, ssl_cert_reqs,",
        ),
        ("redis://h:6379/0?foo=1", "unknown option 'foo' (redis:// takes none"),
        # TLS options on a URL without TLS: the connection was in clear text
        (
            "redis://h:6379/0?ssl_cert_reqs=required",
            "ssl_cert_reqs is an option of rediss:// (TLS): redis:// does not use TLS",
        ),
        (
            "redis+cluster://a:7000,b:7001/0?ssl_ca_certs=/etc/ssl/ca.pem",
            "ssl_ca_certs is an option of rediss+cluster:// (TLS)",
        ),
        # values coredis raised on while the hub started (KeyError, FileNotFoundError)
        (
            "rediss://h:6380/0?ssl_cert_reqs=requried",
            "ssl_cert_reqs must be none, optional or required, got 'requried'",
        ),
        (
            "rediss://h:6380/0?ssl_check_hostname=maybe",
            "ssl_check_hostname must be true or false, got 'maybe'",
        ),
        (
            "rediss://h:6380/0?ssl_ca_certs=/nonexistent/ca.pem",
            "ssl_ca_certs: cannot read /nonexistent/ca.pem",
        ),
        (
            "rediss://h:6380/0?ssl_certfile=/nonexistent/c.pem",
            "ssl_certfile and ssl_keyfile go together",
        ),
        (
            "rediss://h:6380/0?ssl_cert_reqs=none&ssl_check_hostname=true",
            "ssl_check_hostname=true cannot go with ssl_cert_reqs=none",
        ),
        ("rediss://h:6380/0?ssl_cert_reqs=required&ssl_cert_reqs=none", "given twice"),
        ("unix:///run/redis.sock?db=x", "db must be a database number, got 'x'"),
        ("unix:///run/redis.sock?ssl_cert_reqs=required", "ssl_cert_reqs is an option"),
    ],
)
def test_a_bad_query_option_is_named_in_one_line(url, message):
    problem = redis_url_problem(url)
    assert problem is not None and message in problem, problem
    assert "\n" not in problem


@pytest.mark.parametrize(
    "url",
    [
        "rediss://:pw@h:6380/0?ssl_cert_reqs=required&ssl_check_hostname=true",
        "rediss://h:6380/0?ssl_cert_reqs=optional&ssl_check_hostname=false",
        "rediss+cluster://a:7000,b:7001/0?ssl_cert_reqs=none",
        "unix:///run/redis.sock?db=3",
    ],
)
def test_documented_options_pass(url):
    assert redis_url_problem(url) is None


def test_a_readable_ca_file_and_client_certificate_pass(tmp_path):
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("redis.internal")
    ca_file, cert_file, key_file = (tmp_path / n for n in ("ca.pem", "c.pem", "k.pem"))
    ca.cert_pem.write_to_path(str(ca_file))
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    url = (
        f"rediss://h:6380/0?ssl_ca_certs={ca_file}&ssl_certfile={cert_file}"
        f"&ssl_keyfile={key_file}&ssl_cert_reqs=required"
    )
    assert redis_url_problem(url) is None
    # a directory of CAs (c_rehash'd) is accepted as coredis accepts it
    assert redis_url_problem(f"rediss://h:6380/0?ssl_ca_certs={tmp_path}") is None
    # a file that is not PEM: coredis' ssl.SSLError was a traceback at start
    problem = redis_url_problem(f"rediss://h:6380/0?ssl_ca_certs={key_file}x")
    assert problem is not None and "ssl_ca_certs: cannot read" in problem
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    problem = redis_url_problem(f"rediss://h:6380/0?ssl_ca_certs={tmp_path / 'junk.pem'}")
    assert problem is not None and "ssl_ca_certs:" in problem, problem


def test_serve_refuses_a_misspelt_tls_option_with_exit_2(monkeypatch, capsys):
    from deskbridge_hub import cli

    monkeypatch.setenv("DESKBRIDGE_SECRET", "s" * 40)
    monkeypatch.setenv("DESKBRIDGE_REDIS_URL", "rediss://:hunter2@h:6380/0?ssl_cert_reqs=yes")
    assert cli.main(["serve"]) == 2
    err = capsys.readouterr().err
    assert "ssl_cert_reqs must be none, optional or required" in err
    assert "hunter2" not in err
