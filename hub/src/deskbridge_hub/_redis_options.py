"""The query options of ``DESKBRIDGE_REDIS_URL``, checked before anything connects.

coredis, which parses the URL, ignores an option it does not know and builds the TLS
context while the app starts: a misspelt option (``ssl_cert_req=required``) left
certificate checks at its default ``optional`` without a word, ``ssl_*`` options on a
plain ``redis://`` URL were ignored (no TLS at all), and a misspelt value or an
unreadable CA file raised inside Hypercorn's lifespan (a traceback, exit 1). Here every
option is one the hub documents (docs/operations.md, "Redis URL"), and the TLS context
is built once the way coredis builds it, so whatever it would raise is one line now.
Messages name options, values and file paths, never the URL (it may carry a password).
"""

from __future__ import annotations

import os
import ssl
import urllib.parse

#: The options of ``rediss://`` and ``rediss+cluster://`` (coredis' names).
TLS_OPTIONS = ("ssl_ca_certs", "ssl_cert_reqs", "ssl_check_hostname", "ssl_certfile", "ssl_keyfile")
#: ``ssl_cert_reqs`` values (coredis' ``CERT_REQS``).
CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
#: ``ssl_check_hostname`` values, as coredis' ``query_param_to_bool`` reads them
#: (any other string was taken as true).
_TRUE = ("1", "t", "true", "y", "yes")
_FALSE = ("0", "f", "false", "n", "no")


def query_problem(scheme: str, query: str) -> str | None:
    """Why the query ``query`` of a Redis URL of scheme ``scheme`` cannot be used, or
    None when every option is known and usable.

    Args:
        scheme: ``redis``, ``rediss``, ``unix``, ``redis+cluster`` or ``rediss+cluster``.
        query: the URL's query string (after ``?``), percent-encoded.

    Returns:
        One sentence naming the option: unknown for the scheme (``rediss://`` takes the
        ``TLS_OPTIONS``, ``unix://`` takes ``db``, ``redis://`` none), given twice, a
        TLS option on a scheme without TLS, a value outside its set, or a file the TLS
        context cannot load (read here: the same files coredis reads at start).
    """
    tls = scheme.startswith("rediss")
    known = TLS_OPTIONS if tls else ("db",) if scheme == "unix" else ()
    options: dict[str, str] = {}
    for name, value in urllib.parse.parse_qsl(query, keep_blank_values=True):
        if name in options:
            return f"option {name!r} given twice"
        if name.startswith("ssl_") and not tls:
            with_tls = "rediss+cluster" if scheme.endswith("+cluster") else "rediss"
            return (
                f"{name} is an option of {with_tls}:// (TLS): {scheme}:// does not use TLS "
                f"(write {with_tls}://... for a Redis that speaks TLS)"
            )
        if name not in known:
            takes = ", ".join(known) or "none"
            return f"unknown option {name!r} ({scheme}:// takes {takes}; docs/operations.md)"
        options[name] = value
    if "db" in options and not options["db"].isdigit():
        return f"db must be a database number, got {options['db']!r}"
    return _tls_problem(options) if tls else None


def _tls_problem(options: dict[str, str]) -> str | None:
    reqs = options.get("ssl_cert_reqs", "optional")
    if reqs not in CERT_REQS:
        return f"ssl_cert_reqs must be none, optional or required, got {reqs!r}"
    check = options.get("ssl_check_hostname", "false").lower()
    if check not in _TRUE + _FALSE:
        return f"ssl_check_hostname must be true or false, got {check!r}"
    if check in _TRUE and reqs == "none":
        return "ssl_check_hostname=true cannot go with ssl_cert_reqs=none (no certificate to check)"
    certfile, keyfile = options.get("ssl_certfile"), options.get("ssl_keyfile")
    if (certfile is None) != (keyfile is None):  # coredis ignored either alone
        return "ssl_certfile and ssl_keyfile go together (a client certificate and its key)"
    context = ssl.create_default_context()
    ca = options.get("ssl_ca_certs")
    if ca is not None:
        try:
            context.load_verify_locations(**{("capath" if os.path.isdir(ca) else "cafile"): ca})
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            return f"ssl_ca_certs: cannot read {ca} as PEM certificates ({_reason(exc)})"
    if certfile is not None and keyfile is not None:
        try:
            context.load_cert_chain(certfile=certfile, keyfile=keyfile)
        except (OSError, ValueError) as exc:
            return (
                f"ssl_certfile/ssl_keyfile: cannot load {certfile} with {keyfile} "
                f"({_reason(exc)})"
            )
    return None


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
