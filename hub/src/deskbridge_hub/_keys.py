"""Key names of the substrate (see ``_substrate``'s docstring for what each holds). Every
key of a user and of that user's jobs carries the user's ``{<user_id>}`` hash tag
(Redis Cluster), so one script can touch them all."""

from __future__ import annotations

GROUP = "bridge-workers"


def presence_key(user_id: str) -> str:
    return f"bridge:presence:{{{user_id}}}"


def jobs_key(user_id: str) -> str:
    return f"bridge:jobs:{{{user_id}}}"


def result_key(user_id: str, job_id: str) -> str:
    return f"bridge:result:{{{user_id}}}:{job_id}"


def index_key(user_id: str) -> str:
    return f"bridge:index:{{{user_id}}}"


def state_key(user_id: str, job_id: str) -> str:
    return f"bridge:state:{{{user_id}}}:{job_id}"


#: The cancel flag's value once a cancel control entry was sent for the job (else "1").
CANCEL_SENT = "sent"


def cancel_key(user_id: str, job_id: str) -> str:
    return f"bridge:cancel:{{{user_id}}}:{job_id}"


def fence_key(user_id: str, job_id: str) -> str:
    """The job's claim epoch (fencing token): raised by every delivery."""
    return f"bridge:fence:{{{user_id}}}:{job_id}"


def idem_key(user_id: str, idempotency_key: str) -> str:
    return f"bridge:idem:{{{user_id}}}:{idempotency_key}"


def owner_key(job_id: str) -> str:
    return f"bridge:job:{{{job_id}}}"


def job_keys(user_id: str, job_id: str, idempotency_key: str | None) -> tuple[str, ...]:
    """The records a running job needs while it runs (``keep_job``): its state, claim
    epoch, cancel flag, owner record and, given one, its idempotency key's record. The
    owner record is in the job id's slot; the others in the user's."""
    keys = (
        state_key(user_id, job_id),
        fence_key(user_id, job_id),
        cancel_key(user_id, job_id),
        owner_key(job_id),
    )
    return keys if idempotency_key is None else (*keys, idem_key(user_id, idempotency_key))


def mailbox_key(mailbox: str) -> str:
    return f"bridge:notify:{{{mailbox}}}"


def progress_key(job_id: str) -> str:
    return f"bridge:progress:{{{job_id}}}"


def outcome_event(payload: str) -> str:
    """The progress-stream entry that ends a job's stream: its result payload."""
    return '{"outcome":' + payload + "}"


def tools_key(user_id: str) -> str:
    return f"bridge:tools:{{{user_id}}}"


def tools_digest_key(user_id: str) -> str:
    """The catalogue's digest, ``<SHA-1 hex> <bytes>``, written with the catalogue so the
    caller's step compares it without hashing the catalogue (``_redis_caller.SUBMIT``)."""
    return f"bridge:toolsha:{{{user_id}}}"


def daemons_key(user_id: str) -> str:
    return f"bridge:daemons:{{{user_id}}}"


def asleep_key(user_id: str) -> str:
    return f"bridge:asleep:{{{user_id}}}"


def revoked_key(user_id: str) -> str:
    """The user's revocation record (``_revocation``): no TTL."""
    return f"bridge:revoked:{{{user_id}}}"


#: The index of revocations (sorted set: user id scored by its cut-off in ms), read by
#: every hub process's sweep (``_revocation``); one key for every user.
REVOCATIONS_KEY = "bridge:revocations"


def mcp_session_key(user_id: str, session_id: str) -> str:
    """A 2025-era MCP session of the user (``_mcp_store``): a hash holding its record and
    the calls it has in flight; TTL the session's idle timeout, refreshed on use."""
    return f"bridge:mcp:{{{user_id}}}:{session_id}"


def proc_key(holder_id: str) -> str:
    return f"bridge:proc:{{{holder_id}}}"


def probe_key(holder_id: str) -> str:
    """A throwaway key in the holder's slot: written to learn whether the store (that
    node, under Cluster) takes writes (``holder_alive``)."""
    return f"bridge:probe:{{{holder_id}}}"


def wake_key(holder_id: str) -> str:
    return f"bridge:wake:{{{holder_id}}}"


def holder_of(session_id: str) -> str | None:
    """The holder process id a session id names (``"<holder>.<random>"``), or None for a
    session id without one."""
    holder, dot, _ = session_id.rpartition(".")
    return holder if dot and holder else None
