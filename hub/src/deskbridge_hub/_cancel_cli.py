"""``deskbridge-hub cancel JOB_ID``: an operator's way to end a stuck job (a tool that
never returns holds its desktop, docs/tools.md) without composing the HTTP request.

It sends ``DELETE /v1/jobs/{job_id}`` to a running hub, so it is the route's own logic
(``Bridge.cancel``), works against any substrate the hub runs on, and needs only the
hub's URL and an API key, not Redis credentials on the operator's machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from typing import Any

from ._cli_args import add_hub_option, hub_url_problem, key_not_set, unreachable_hint
from ._inspect_cli import NotTheHub, first_api_key, request_json, unreachable_reason
from ._validate import validate_job_id

#: Exit statuses (also in ``cancel --help`` and docs/operations.md).
EXIT_REQUESTED = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_FINISHED = 3
EXIT_UNKNOWN = 4


def add_parser(sub: Any) -> None:
    """Add the ``cancel`` sub-command to ``sub`` (argparse sub-parsers)."""
    p = sub.add_parser(
        "cancel",
        help="cancel a job through a running hub (DELETE /v1/jobs/JOB_ID)",
        description="Cancel JOB_ID through a running hub's HTTP API (DELETE /v1/jobs/JOB_ID, "
        "authenticated with the first key of $DESKBRIDGE_API_KEY): a queued job never "
        "starts, a running async tool is cancelled on the desktop. Exit "
        f"{EXIT_REQUESTED} cancel requested, {EXIT_FINISHED} the job already had its "
        f"answer, {EXIT_UNKNOWN} no such job, {EXIT_FAILED} the hub refused or could not "
        f"be reached, {EXIT_USAGE} usage errors.",
    )
    p.add_argument("job_id", metavar="JOB_ID")
    p.add_argument("--json", action="store_true", help="print the API's JSON answer")
    add_hub_option(p)


def run(args: argparse.Namespace) -> int:
    """Run ``cancel``; returns the exit status (above)."""
    try:  # the hub's rule, said before asking it
        validate_job_id(args.job_id, "JOB_ID")
    except ValueError as exc:
        print(f"deskbridge-hub cancel: {exc}", file=sys.stderr)
        return EXIT_USAGE
    problem = hub_url_problem(args.hub)
    if problem:
        print(f"deskbridge-hub cancel: {problem}", file=sys.stderr)
        return EXIT_USAGE
    path = f"/v1/jobs/{urllib.parse.quote(args.job_id, safe='')}"
    status, body = request_json(args.hub, path, method="DELETE")
    if status is None:
        reason = unreachable_reason(body) + unreachable_hint(args.hub)
        print(f"deskbridge-hub cancel: cannot reach hub at {args.hub}: {reason}", file=sys.stderr)
        return EXIT_FAILED
    if isinstance(body, NotTheHub):  # not "no such job" (a 404 of another server)
        print(f"deskbridge-hub cancel: {body}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps(body, indent=2))
    answer = body if isinstance(body, dict) else {}
    if status == 202:
        if not args.json:
            print(f"{args.job_id}: cancel requested (stage {answer.get('stage', '?')})")
        return EXIT_REQUESTED
    if status == 409 and answer.get("cancel_requested") is False:
        if not args.json:
            print(f"{args.job_id}: not cancelled, it already had its answer (stage finished)")
        return EXIT_FINISHED
    error = answer.get("error", {}) if isinstance(answer.get("error"), dict) else {}
    print(
        f"deskbridge-hub cancel: {status} {error.get('code', '')}: {error.get('message', body)}",
        file=sys.stderr,
    )
    if status == 401 and not first_api_key():  # as ``call`` and ``inspect`` say it
        print(key_not_set("cancel"), file=sys.stderr)
    # the hub's own 404 only: a JSON 404 of another server says nothing of the job
    return EXIT_UNKNOWN if status == 404 and error.get("code") == "not_found" else EXIT_FAILED
