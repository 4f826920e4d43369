"""``deskbridge-hub revoke USER_ID``: revoke every sidecar token of one user issued up to
now, in the hub's Redis (``DESKBRIDGE_REDIS_URL``), and close the user's live session.

Writes the user's revocation record (``_revocation``), tells the hub process holding the
user's session (it closes it with 4003 "token revoked" at once; every process's sweep does
within a heartbeat otherwise), waits until the cut-off second has passed (so a token
issued once the command returned is accepted), and says what it did. Exit status: 0
revoked, 1 Redis could not be reached (nothing was revoked; or the write went out and
its answer was lost: it may be recorded, and the message says to run it again), 2 usage.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from typing import Any

EPILOG = """\
Tokens are refused by their issue time (iat): every token of USER_ID issued up to the
current second, on any desktop; a token issued afterwards (deskbridge-hub token USER_ID)
works. The hub process holding the user's socket closes it with 4003 ("token revoked");
the sidecar's reconnect is refused with 401 and it stops.

environment:
  DESKBRIDGE_REDIS_URL   the hub's Redis (redis://, rediss://, unix://); required

exit status:
  0  revoked (the record is written; says whether a session was told)
  1  Redis could not be reached: nothing was revoked (or, when the write went out and
     its answer was lost, it may be recorded: the message says so; run it again)
  2  usage: no or an in-memory DESKBRIDGE_REDIS_URL, a malformed user id
"""


def add_parser(sub: Any) -> None:
    """Add the ``revoke`` sub-command to ``sub`` (argparse sub-parsers)."""
    p = sub.add_parser(
        "revoke",
        help="revoke every sidecar token of a user issued up to now (in DESKBRIDGE_REDIS_URL)",
        description="Revoke every sidecar token of USER_ID issued up to now and close its "
        "live session (4003). Writes to the hub's Redis, DESKBRIDGE_REDIS_URL.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("user_id", metavar="USER_ID")


def _usage_problem(user_id: str) -> str | None:
    from deskbridge_common._envnames import misspelling_hint

    from ._config import MEMORY_URL, redis_url_problem
    from ._validate import validate_user_id

    url = os.environ.get("DESKBRIDGE_REDIS_URL", "")
    if not url:
        hint = misspelling_hint("DESKBRIDGE_REDIS_URL")
        return f"DESKBRIDGE_REDIS_URL is not set: revocations live in the hub's Redis{hint}"
    if url == MEMORY_URL:
        return (
            "DESKBRIDGE_REDIS_URL is memory://: the in-memory substrate lives inside the one "
            "hub process; restart it with a new DESKBRIDGE_SECRET to revoke there"
        )
    problem = redis_url_problem(url)
    if problem:
        return problem
    try:
        validate_user_id(user_id, "USER_ID")
    except ValueError as exc:
        return str(exc)
    return None


def _utc(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


def run(args: argparse.Namespace) -> int:
    """Run ``revoke``; returns the exit status (module docstring)."""
    import trio
    from deskbridge_common import Timings

    from ._errors import SubstrateUnavailable

    problem = _usage_problem(args.user_id)
    if problem:
        print(f"deskbridge-hub revoke: {problem}", file=sys.stderr)
        return 2
    try:
        ttl_s = Timings.from_env().presence_ttl_s
    except ValueError as exc:
        print(f"deskbridge-hub revoke: {exc}", file=sys.stderr)
        return 2
    try:
        done = trio.run(_revoke, os.environ["DESKBRIDGE_REDIS_URL"], args.user_id, ttl_s)
    except SubstrateUnavailable as exc:
        if exc.unsent or exc.refused:
            said = "nothing was revoked"
        else:  # sent, and its reply lost (a stall, a cut connection): maybe recorded
            said = (
                "the revocation may or may not be recorded: run deskbridge-hub revoke "
                f"{args.user_id} again (repeating it is safe)"
            )
        print(f"deskbridge-hub revoke: {exc}; {said}", file=sys.stderr)
        return 1
    before = _utc(done.revocation.before_s)
    print(f"revoked: tokens of {args.user_id} issued before {before} UTC are refused")
    if done.kept_later:
        print(
            f"(an earlier revocation's later cut-off is kept; this machine's clock says "
            f"{_utc(done.asked.at_s)} UTC: it may be behind the one that made it)"
        )
    if done.holder is None:
        print(f"no sidecar of {args.user_id} is connected")
    elif done.notified:
        print(f"session {done.holder} told to close (4003 token revoked)")
    else:
        print(
            f"session {done.holder} could not be told; its hub closes it within a "
            "heartbeat (DESKBRIDGE_HEARTBEAT_S)"
        )
    return 0


async def _revoke(url: str, user_id: str, ttl_s: float) -> Any:
    import trio

    from ._redis import RedisSubstrate
    from ._revocation import revoke_user

    substrate = RedisSubstrate.from_url(url)
    try:
        done = await revoke_user(substrate, user_id, now_s=time.time(), notice_ttl_s=ttl_s)
    finally:
        await substrate.aclose()
    # a token issued once this returns (on this clock) is issued after the cut-off
    # (this command's: a later one kept was made on a clock ahead of this one)
    await trio.sleep(max(0.0, done.asked.before_s - time.time()))
    return done
