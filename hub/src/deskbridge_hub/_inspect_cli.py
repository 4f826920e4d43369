"""``deskbridge-hub inspect``: the admin API as tables (or ``--json`` for scripts).

    deskbridge-hub inspect desktops [--offset N] [--limit N]
    deskbridge-hub inspect user USER_ID
    deskbridge-hub inspect job JOB_ID

Talks to a running hub over HTTP (``--hub``, default ``$DESKBRIDGE_HUB_HTTP`` or
http://127.0.0.1:8080) with ``$DESKBRIDGE_API_KEY``. Exit status: 0 answered, 1 the hub
answered an error or cannot be reached (one line on stderr), 2 usage.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from deskbridge_common._logtext import escape_controls

from ._admin import DEFAULT_LIMIT, MAX_LIMIT, MAX_OFFSET
from ._cli_args import add_hub_option, hub_url_problem, integer, key_not_set, unreachable_hint
from ._validate import validate_job_id, validate_user_id


def add_parser(sub: Any) -> None:
    """Add the ``inspect`` sub-command to ``sub`` (argparse sub-parsers)."""
    p = sub.add_parser(
        "inspect",
        help="show connected desktops, one user's desktop and queue, or one job",
        description="Show what a running hub knows (GET /v1/admin/... and /v1/jobs/...). "
        "Exit 0 answered, 1 the hub answered an error or cannot be reached, 2 usage, "
        "130 on Ctrl-C.",
    )
    p.add_argument("what", choices=["desktops", "user", "job"])
    p.add_argument("id", nargs="?", metavar="ID", help="USER_ID for user, JOB_ID for job")
    p.add_argument("--json", action="store_true", help="print the API's JSON answer")
    p.add_argument(
        "--offset", type=integer(0, MAX_OFFSET), default=0, help="desktops: rows to skip (>= 0)"
    )
    p.add_argument(
        "--limit",
        type=integer(1, MAX_LIMIT),
        default=DEFAULT_LIMIT,
        help=f"desktops: rows to show (1-{MAX_LIMIT})",
    )
    add_hub_option(p)


def run(args: argparse.Namespace) -> int:
    """Run ``inspect``; returns the exit status."""
    if args.what != "desktops" and not args.id:
        print(f"deskbridge-hub inspect {args.what}: an ID is required", file=sys.stderr)
        return 2
    problem = _id_problem(args.what, args.id)
    if problem:
        print(f"deskbridge-hub inspect: {problem}", file=sys.stderr)
        return 2
    problem = hub_url_problem(args.hub)
    if problem:
        print(f"deskbridge-hub inspect: {problem}", file=sys.stderr)
        return 2
    quote = urllib.parse.quote
    if args.what == "desktops":
        path = f"/v1/admin/desktops?offset={args.offset}&limit={args.limit}"
    elif args.what == "user":
        path = f"/v1/admin/users/{quote(args.id, safe='')}"
    else:
        path = f"/v1/jobs/{quote(args.id, safe='')}"
    status, body = request_json(args.hub, path)
    if status is None:
        print(
            f"deskbridge-hub inspect: cannot reach hub at {args.hub}: "
            f"{unreachable_reason(body)}{unreachable_hint(args.hub)}",
            file=sys.stderr,
        )
        return 1
    if isinstance(body, NotTheHub):
        print(f"deskbridge-hub inspect: {body}", file=sys.stderr)
        return 1
    if status != 200:
        error = body.get("error", {}) if isinstance(body, dict) else {}
        print(
            f"deskbridge-hub inspect: {status} {error.get('code', '')}: "
            f"{error.get('message', body)}",
            file=sys.stderr,
        )
        if status == 401 and not first_api_key():  # as ``call`` says it
            print(key_not_set("inspect"), file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(body, indent=2))
    elif args.what == "desktops":
        print(desktops_table(body))
    elif args.what == "user":
        print(user_text(body))
    else:
        print(job_text(body))
    return 0


def _id_problem(what: str, id_: str | None) -> str | None:
    """Why ``ID`` does not fit ``what`` (the hub's own rule, said before asking it)."""
    if what == "desktops":
        return None if id_ is None else f"inspect desktops takes no ID, got {id_!r}"
    try:
        if what == "user":
            validate_user_id(id_, "USER_ID")
        else:
            validate_job_id(id_, "JOB_ID")
    except ValueError as exc:
        return str(exc)
    return None


def unreachable_reason(exc: object) -> str:
    """One short cause for a failed request (``Connection refused``, ``timed out``), without
    urllib's ``<urlopen error [Errno 111] ...>`` wrapping."""
    reason = getattr(exc, "reason", exc)
    return getattr(reason, "strerror", None) or str(reason)


def first_api_key() -> str:
    """The first key of ``$DESKBRIDGE_API_KEY`` ("" when unset), which ``call``,
    ``inspect`` and ``cancel`` send."""
    return os.environ.get("DESKBRIDGE_API_KEY", "").split(",")[0].strip()


class NotTheHub:
    """An HTTP answer that is not a deskbridge hub's: the hub answers every request with
    a JSON object; another server at ``--hub`` (a wrong port, a proxy's own error page)
    mostly does not. ``str()`` is
    the one line the CLI prints. (``cancel`` took such a bare 404 for "no such job",
    ``inspect`` said "404 : Not Found", ``call`` printed the page and exited 0 on a 200.)
    """

    def __init__(self, status: int, hub: str, raw: bytes) -> None:
        self.status = status
        self.hub = hub
        self.raw = raw

    def __str__(self) -> str:
        text = self.raw.decode("utf-8", "replace").strip()
        shown = f"body {' '.join(text.split())[:60]!r}" if text else "an empty body"
        return (
            f"HTTP {self.status} from {self.hub}: not a deskbridge hub's answer ({shown}): "
            "check --hub (the hub's HTTP address, e.g. http://127.0.0.1:8080)"
        )


def hub_answer(status: int, hub: str, raw: bytes) -> Any:
    """The hub's JSON answer ``raw`` (a dict), or :class:`NotTheHub` when it is not a
    JSON object (an empty body, a page, plain text)."""
    try:
        body = json.loads(raw)
    except ValueError:  # not JSON, or not UTF-8
        return NotTheHub(status, hub, raw)
    return body if isinstance(body, dict) else NotTheHub(status, hub, raw)


def read_answer(req: urllib.request.Request, timeout_s: float) -> tuple[int, bytes]:
    """Send ``req`` and read the whole answer, whatever its status: (status, body).

    Raises:
        urllib.error.URLError, OSError, ValueError: the hub could not be reached (or
            the answer not read within ``timeout_s`` seconds per socket operation).
    """
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:  # a non-2xx answer: read like any other
        return exc.code, exc.read()


def request_json(hub: str, path: str, method: str = "GET") -> tuple[int | None, Any]:
    """``method`` ``hub`` + ``path`` with the first key of ``$DESKBRIDGE_API_KEY``:
    (HTTP status, the hub's JSON answer or :class:`NotTheHub`), or (None, the exception)
    when the hub could not be reached (a 30 s bound on each socket operation)."""
    req = urllib.request.Request(hub.rstrip("/") + path, method=method)
    key = first_api_key()
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        status, raw = read_answer(req, 30)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return None, exc
    return status, hub_answer(status, hub, raw)


def _when(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return "-"
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def _text(value: Any) -> str:
    """``value`` as text for a terminal: control characters escaped (``\\x1b``, ``\\n``).
    Sidecars and callers choose some of what is shown (``hello.sidecar_version`` is any
    64 characters): printed as is, an escape sequence reached the operator's terminal."""
    return escape_controls(str(value))


def table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    """Plain-text columns, left-aligned, two spaces apart (control characters escaped)."""
    rows = [[_text(c) for c in row] for row in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    lines = [header, *rows]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=False)).rstrip()
        for line in lines
    )


def _state(online: bool | None) -> str:
    """A desktop's state from the admin API's ``online`` (null: presence in doubt, a
    call would be answered unavailable)."""
    return "unknown" if online is None else "online" if online else "offline"


def desktops_table(body: dict[str, Any]) -> str:
    rows = []
    for d in body["desktops"]:
        queue = d.get("queue") or {}
        rows.append(
            [
                d["user_id"],
                _text(d.get("status") or _state(d["online"])),
                _when(d.get("since")),
                d.get("sidecar_version") or "-",
                ",".join(d.get("tools") or []) or "-",
                str(queue.get("length", "-")),
                str(queue.get("pending_count", "-")),
            ]
        )
    header = ["USER", "STATE", "SINCE (UTC)", "SIDECAR", "TOOLS", "STREAM", "PENDING"]
    shown = f"{body['offset'] + 1}-{body['offset'] + len(rows)}" if rows else "none"
    footer = f"\n{shown} of {body['total']} desktops"
    if body.get("next_offset") is not None:
        footer += f" (next: --offset {body['next_offset']})"
    return table(rows, header) + footer


def _user_state(body: dict[str, Any]) -> str:
    """``online since ... UTC``, ``offline since ... UTC`` (or the admin API's ``status``:
    ``asleep``, ``unknown``), or what is known instead: a user id no sidecar used (a typo)
    printed "offline since - UTC", as if it had been."""
    state = _text(body.get("status") or _state(body["online"]))
    if isinstance(body.get("since"), int | float):
        return f"{state} since {_when(body['since'])} UTC"
    seen = ("session_id", "connected_at", "ended_at", "end", "sidecar_version", "hub_consumer")
    if body["online"] is False and not any(body.get(k) for k in seen):
        return (
            f"never seen: no sidecar of {_text(body['user_id'])!r} connected in the last "
            "week (the directory's memory): check the user id"
        )
    return f"{state} (since when is not known)"


def job_text(body: dict[str, Any]) -> str:
    """``GET /v1/jobs/{job_id}`` as a field/value table; ``at`` (a Unix time) in UTC, as
    ``desktops`` and ``user`` print times."""
    rows = [
        [k, f"{_when(v)} UTC" if k == "at" and isinstance(v, int | float) else _cell(v)]
        for k, v in body.items()
    ]
    return table(rows, ["field", "value"])


def user_text(body: dict[str, Any]) -> str:
    lines = [
        f"user        {_text(body['user_id'])}",
        f"state       {_user_state(body)}",
        f"session     {_text(body.get('session_id') or '-')}",
        f"sidecar     {_text(body.get('sidecar_version') or '-')}",
        f"hub         {_text(body.get('hub_consumer') or '-')}",
        f"tools       {_text(', '.join(body.get('tools') or []) or '-')}",
        f"stream      {body['queue']['length']} entries (delivered ones stay until trimmed), "
        f"{body['queue']['pending_count']} pending",
    ]
    if body.get("end"):
        end = body["end"]
        lines.append(f"last end    {_text(end.get('code'))} {_text(end.get('reason'))}")
    revoked = body.get("revoked")
    if isinstance(revoked, dict):
        lines.append(
            f"revoked     tokens issued before {_when(revoked.get('before'))} UTC are refused "
            f"(revoked {_when(revoked.get('at'))} UTC)"
        )
    pending = body["queue"]["pending"]
    if pending:
        lines.append("")
        lines.append(
            table(
                [
                    [p["entry_id"], p.get("job_id") or "-", p["consumer"],
                     f"{p['idle_ms'] / 1000:.1f}", str(p["deliveries"])]
                    for p in pending
                ],
                ["ENTRY ID", "JOB ID", "CONSUMER", "IDLE S", "DELIVERIES"],
            )
        )  # fmt: skip
    return "\n".join(lines)
