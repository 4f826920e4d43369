"""The idempotency-key index: one record per (user, key) naming the job that key started.

No I/O. The record lives at ``bridge:idem:{<user_id>}:<idempotency_key>`` (the user's
slot, so the caller's one enqueue script reads and writes it with the job's other keys),
from the enqueue until the job's deadline plus the result TTL, and at least as long as
the job's published answer (the holder's publish step extends it; docs/outcomes.md).
While its job is forwarded and unanswered it lives as long as the job's state
(``_jobstate.forwarded_keep_s``: the delivery's mark keeps it, a holder that dies
writes nothing more); the answer sets it back to its own lifetime.

A call with a key whose record exists never enqueues: with the same tool and arguments
it attaches to that job (its answer, or a wait for it); with other arguments or another
tool it is refused before anything is written (``idempotency_key_reused``, HTTP 422, as
Stripe answers a reused key).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import attrs


def args_digest(args: dict[str, Any]) -> str:
    """SHA-256 (hex, first 32 digits) of the canonical JSON of ``args`` (sorted keys, no
    whitespace): equal arguments give equal digests whatever their key order."""
    text = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def request_digest(tool: str, digest: str, key: str | None) -> str:
    """SHA-256 (hex, first 32 digits) of one request naming its own job id: its tool,
    :func:`args_digest` of its arguments and its idempotency key (None: none given,
    the job id is its key). Carried in the id's owner record (``JobOwner.request``), so
    the same request sent again knows the claim for its own (a claim whose reply was
    lost, a copy on another replica)."""
    text = f"{tool}\n{digest}\n{'' if key is None else '=' + key}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


@attrs.frozen
class IndexRecord:
    """What an idempotency key names.

    Attributes:
        job_id: the job the key started (job ids and tool names contain no spaces).
        tool: its tool name.
        digest: :func:`args_digest` of its arguments.
        deadline: the job's deadline (Unix seconds on the substrate's clock, Redis
            ``TIME``), appended by the enqueue step; None in records of older hubs. A
            retry that attaches learns from it until when the job may still start.
    """

    job_id: str
    tool: str
    digest: str
    deadline: float | None = None

    def encode(self) -> str:
        """``"<job_id> <tool> <digest>"`` (`` <deadline>`` with 3 decimals when known);
        the job id first (the publish script matches on that prefix). The caller
        encodes it without a deadline: the enqueue step appends it from its clock."""
        head = f"{self.job_id} {self.tool} {self.digest}"
        return head if self.deadline is None else f"{head} {self.deadline:.3f}"

    @classmethod
    def decode(cls, text: str) -> IndexRecord:
        """Parse a stored record.

        Raises:
            ValueError: not three or four space-separated parts, or a deadline that is
                not a number.
        """
        parts = text.split(" ")
        if len(parts) not in (3, 4):
            raise ValueError(f"not an idempotency index record: {text[:80]!r}")
        deadline = float(parts[3]) if len(parts) == 4 else None
        return cls(parts[0], parts[1], parts[2], deadline)

    def same_request(self, tool: str, digest: str) -> bool:
        """True if a call with ``tool`` and arguments digest ``digest`` repeats this one."""
        return self.tool == tool and self.digest == digest
