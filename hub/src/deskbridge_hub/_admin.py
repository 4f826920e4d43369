"""The admin API (API key required, as every ``/v1/`` route): what an operator looks at.

* ``GET /v1/admin/desktops?offset=0&limit=100`` - desktops from the directory
  (``_directory``), newest activity first, each with presence (online or not, since
  when), sidecar version, tools and, for online ones, queue depth and pending entries.
* ``GET /v1/admin/users/{user_id}`` - one desktop: presence, its session record, tool
  catalogue, queue length, pending entries with consumer, idle time, delivery count and
  job id (the jobs in flight), and the user's token revocation (``revoked``: ``before``
  and ``at``, Unix seconds, or null; ``_revocation``).
* ``GET /v1/jobs/{job_id}`` - one job's state (``_jobstate``) and, once answered, its
  ``outcome`` (the result payload, while kept).

The first two are also served under ``/admin/api/`` (``desktops``, ``users/{user_id}``) for
the connectors page.

Every answer is built from the shared substrate, so any replica gives the same one.
"""

from __future__ import annotations

import json
from typing import Any

from deskbridge_common import _codes
from quart import request
from quart_trio import QuartTrio

from ._bridge import _UNREAD
from ._errors import BadRequest
from ._memory_desktop import decode_asleep
from ._own_liveness import PresenceInDoubt
from ._validate import validate_key, validate_user_id

#: Most rows per desktops page, and the default.
MAX_LIMIT = 500
DEFAULT_LIMIT = 100
#: Largest ``offset`` of a desktops page (a bound, so a typo is a 400, not a huge ZRANGE).
MAX_OFFSET = 10**9
#: Most pending entries listed for one user.
MAX_PENDING_LISTED = 100


def _int_arg(name: str, default: int, low: int, high: int) -> int:
    raw = request.args.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name} must be an integer", field=name) from None
    if not low <= value <= high:
        raise BadRequest(f"{name} must be in [{low}, {high}]", field=name)
    return value


def _check(validator: Any, value: str, field: str) -> None:
    try:
        validator(value, field)  # the message names the field that was wrong
    except ValueError as exc:
        raise BadRequest(str(exc), field=field) from None


def _loads(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


#: ``desktop_row``'s ``holder`` for a desktop whose presence is in doubt (no presence
#: while this process's own writes are in doubt: a call is answered ``unavailable``).
IN_DOUBT = object()


async def seen_holder(bridge: Any, user_id: str, read: Any, *, look_again: bool) -> Any:
    """The holder session of ``user_id``'s desktop as a call sees it
    (``Bridge.live_session``: the raw presence ``read``, counted only while its process
    lives), or :data:`IN_DOUBT`. Raises SubstrateUnavailable (Redis unreachable)."""
    try:
        return await bridge.live_session(user_id, read, look_again=look_again)
    except PresenceInDoubt:
        return IN_DOUBT


def desktop_status(holder: Any, asleep: str | None) -> str:
    """A desktop's ``status`` as ``GET /v1/users/{id}/presence`` says it, from its live
    holder (``seen_holder``) and its stored asleep record (text, or None): ``online``,
    ``asleep`` (a call is answered ``offline`` with ``detail.reason`` ``asleep``),
    ``offline``, or ``unknown`` (presence in doubt: a call is answered ``unavailable``)."""
    if holder is IN_DOUBT:
        return "unknown"
    if holder is not None:
        return "online"
    return "offline" if decode_asleep(asleep) is None else "asleep"


def desktop_row(
    user_id: str, changed_at: float | None, holder: Any, record: Any, catalogue: Any
) -> dict[str, Any]:
    """One desktop as the admin API shows it (no I/O). ``holder``: the live holder
    session (``seen_holder``), None (offline) or ``IN_DOUBT`` (``online: null``)."""
    record = record if isinstance(record, dict) else {}
    if holder is IN_DOUBT:
        row = desktop_row(user_id, changed_at, None, record, catalogue)
        row.update(online=None, since=None)
        return row
    online = holder is not None
    same_session = online and record.get("session_id") == holder
    if online:
        since = record.get("connected_at") if same_session else None
    else:
        since = record.get("ended_at")
    tools = (
        [t.get("name") for t in catalogue if isinstance(t, dict)]
        if isinstance(catalogue, list)
        else record.get("tools")
    )
    return {
        "user_id": user_id,
        "online": online,
        "since": since,
        "session_id": holder,
        "sidecar_version": record.get("sidecar_version") if same_session or not online else None,
        "tools": tools,
        "connected_at": record.get("connected_at"),
        "ended_at": record.get("ended_at"),
        "end": record.get("end"),
        # another session's hub is not the holder's (its start went unrecorded)
        "hub_consumer": record.get("consumer") if same_session or not online else None,
        "changed_at": changed_at,
    }


def register(app: QuartTrio, holder: dict[str, Any], json_response: Any) -> None:
    """Add the admin routes to ``app``; ``holder["state"]`` is the running HubState."""

    # Also under /admin/api/: a browser that authenticated for /admin/ sends its Basic
    # credentials again only below that path (the connectors page's fetches).
    @app.get("/v1/admin/desktops")
    @app.get("/admin/api/desktops")
    async def admin_desktops():  # type: ignore[no-untyped-def]
        offset = _int_arg("offset", 0, 0, MAX_OFFSET)
        limit = _int_arg("limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
        substrate = holder["state"].substrate
        page = await substrate.list_desktops(offset=offset, limit=limit)
        users = [user for user, _ in page.rows]
        infos = await substrate.desktops_info(users)
        rows = []
        for (user, changed_at), (present, record, catalogue, asleep) in zip(
            page.rows, infos, strict=True
        ):
            # online as a call sees it (a page: no second look, in doubt is null)
            live = await seen_holder(holder["bridge"], user, present, look_again=False)
            row = desktop_row(user, changed_at, live, _loads(record), _loads(catalogue))
            row["status"] = desktop_status(live, asleep)
            if row["online"]:
                queue = await substrate.queue_info(user, count=0)
                row["queue"] = {"length": queue.length, "pending_count": queue.pending_count}
            rows.append(row)
        following = offset + len(rows)
        return json_response(
            {
                "total": page.total,
                "offset": offset,
                "limit": limit,
                "next_offset": following if following < page.total and rows else None,
                "desktops": rows,
            }
        )

    @app.get("/v1/admin/users/<user_id>")
    @app.get("/admin/api/users/<user_id>")
    async def admin_user(user_id: str):  # type: ignore[no-untyped-def]
        _check(validate_user_id, user_id, "user_id")
        substrate = holder["state"].substrate
        ((_, record, catalogue, asleep),) = await substrate.desktops_info([user_id])
        # online as ``GET /v1/users/{id}/presence`` and a call decide it (second look too)
        live = await seen_holder(holder["bridge"], user_id, _UNREAD, look_again=True)
        row = desktop_row(user_id, None, live, _loads(record), _loads(catalogue))
        row["status"] = desktop_status(live, asleep)
        queue = await substrate.queue_info(user_id, count=MAX_PENDING_LISTED)
        ids = [p.entry_id for p in queue.pending]
        job_ids = await substrate.job_ids(user_id, ids) if ids else {}
        pending = [
            {
                "entry_id": p.entry_id,
                "job_id": job_ids.get(p.entry_id),
                "consumer": p.consumer,
                "idle_ms": p.idle_ms,
                "deliveries": p.deliveries,
            }
            for p in queue.pending
        ]
        row.pop("changed_at")
        row["catalogue"] = _loads(catalogue)
        row["queue"] = {
            "length": queue.length,
            "pending_count": queue.pending_count,
            "pending": pending,
        }
        row["in_flight"] = [p["job_id"] for p in pending if p["job_id"]]
        revocation = await substrate.get_revocation(user_id)
        row["revoked"] = None if revocation is None else revocation.shown()
        return json_response(row)

    @app.get("/v1/jobs/<job_id>")
    async def job_state(job_id: str):  # type: ignore[no-untyped-def]
        _check(validate_key, job_id, "job_id")
        state = await holder["bridge"].job_state(job_id)  # finds the user from the id
        if state is None:
            return json_response(
                {
                    "error": {
                        "code": _codes.NOT_FOUND,
                        "message": f"no job {job_id!r} (unknown, or its state expired)",
                    }
                },
                404,
            )
        body = {"job_id": job_id, **json.loads(state.encode())}
        body["terminal"] = state.stage.terminal
        if state.stage.terminal:  # its answer, as its caller got it (one read more)
            answer = await holder["bridge"].answer_of(job_id)
            if answer is not None:
                body["outcome"] = json.loads(answer)
        return json_response(body)
