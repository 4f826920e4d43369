"""What is known about one job: its stage, as one typed value with one transition table.

No I/O. The job state lives at ``bridge:state:{<job_id>}`` (see ``_substrate``) as the JSON
text of :meth:`JobState.encode`; every writer (the bridge, the delivery module, both
substrates) goes through :class:`JobState`, so the stored shape is written in one place.

Stages (h11-style: one table, checked by :func:`check_transition`)::

    queued ──> delivered <────> awaiting_approval
      │          │   ^                │
      │          v   │ (redelivered)  │
      │        interrupted <──────────┘
      │
      │   delivered | awaiting_approval | interrupted ──> finished | cancelled | expired | lost
      └──> finished | cancelled | expired | lost     (answered before it was delivered)

``awaiting_approval``: delivered, and the desktop said the tool waits for the person's
approval before it starts (a ``progress`` frame with ``stage``; issue 12 item 5); back to
``delivered`` once approved; declined -> ``cancelled`` (outcome ``declined``); its
deadline first -> ``expired``. ``finished`` means the tool's answer (completed or failed)
is published; ``cancelled``, ``expired`` and ``lost`` are the other terminal answers.
``interrupted``: it was on a desktop whose socket went away before it answered; the entry
stays pending and is redelivered. A terminal stage is final: a late cancel is answered "finished".
"""

from __future__ import annotations

import enum
import json

import attrs
from deskbridge_common import STAGE_AWAITING_APPROVAL, STAGE_RUNNING


class Stage(enum.StrEnum):
    """A job's stage (the ``stage`` field of its state)."""

    QUEUED = "queued"
    DELIVERED = "delivered"
    AWAITING_APPROVAL = "awaiting_approval"
    INTERRUPTED = "interrupted"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    LOST = "lost"

    @property
    def terminal(self) -> bool:
        """True for the stages after which nothing more happens to the job."""
        return self in TERMINAL


TERMINAL = frozenset({Stage.FINISHED, Stage.CANCELLED, Stage.EXPIRED, Stage.LOST})
#: A job forwarded to a desktop and not answered yet: it may have run, so only the
#: desktop's ledger can say whether it did (a redelivery past its deadline goes to the
#: desktop, never "expired" by the hub; issue 16). ``awaiting_approval`` too: once approved
#: the tool may run before its ``running`` report is recorded (issue 12 item 5).
FORWARDED = frozenset({Stage.DELIVERED, Stage.AWAITING_APPROVAL, Stage.INTERRUPTED})

#: Longest accepted ``timeout_s`` (``_bridge_jobs.MAX_TIMEOUT_S``): one day.
LONGEST_TIMEOUT_S = 24 * 3600.0


def forwarded_keep_s(result_ttl_s: float) -> float:
    """How long a forwarded, unanswered job's state (and claim epoch) is kept from its last
    write: as long as a cancel flag, the longest deadline + the result TTL. Nobody may
    serve such a job for a long while (its desktop away, its holder process dead); when
    the desktop comes back its ledger answers it, and the mark must still see that it was
    forwarded (a lapsed state read as "never forwarded", past the deadline: ``expired``
    for a job that may have run). The answer's write shortens it to the result TTL."""
    return LONGEST_TIMEOUT_S + result_ttl_s


#: ``JobState.daemon_id`` of a job delivered to more than one desktop, or to one whose
#: ``daemon_id`` is not known (an older sidecar, a record written by an older hub).
MIXED = "?"

#: Which stage may follow which (the only table; a stage may repeat: a redelivery
#: marks an already-delivered job delivered again).
TRANSITIONS: dict[Stage, frozenset[Stage]] = {
    Stage.QUEUED: frozenset({Stage.QUEUED, Stage.DELIVERED} | TERMINAL),
    Stage.DELIVERED: frozenset(
        {Stage.DELIVERED, Stage.AWAITING_APPROVAL, Stage.INTERRUPTED} | TERMINAL
    ),
    Stage.AWAITING_APPROVAL: frozenset(
        {Stage.AWAITING_APPROVAL, Stage.DELIVERED, Stage.INTERRUPTED} | TERMINAL
    ),
    Stage.INTERRUPTED: frozenset({Stage.INTERRUPTED, Stage.DELIVERED} | TERMINAL),
    Stage.FINISHED: frozenset(),
    Stage.CANCELLED: frozenset(),
    Stage.EXPIRED: frozenset(),
    Stage.LOST: frozenset(),
}

#: The terminal stage recorded after publishing a result payload of each outcome
#: (``_jobs.OUTCOMES``): the tool's own answers are "finished".
STAGE_OF_OUTCOME: dict[str, Stage] = {
    "completed": Stage.FINISHED,
    "failed": Stage.FINISHED,
    "in_doubt": Stage.FINISHED,  # the desktop's answer: it started once, never again
    "declined": Stage.CANCELLED,  # refused at the desktop before it started
    "cancelled": Stage.CANCELLED,
    "expired": Stage.EXPIRED,
    "lost": Stage.LOST,
}


#: The job stage a desktop's ``progress.stage`` report means.
STAGE_OF_DESK: dict[str, Stage] = {
    STAGE_AWAITING_APPROVAL: Stage.AWAITING_APPROVAL,
    STAGE_RUNNING: Stage.DELIVERED,
}


def delivered_again(before: JobState | None, state: JobState) -> tuple[JobState, bool]:
    """The state a delivery records, and whether an earlier one went elsewhere.

    ``before`` is the stored state if it says the job was forwarded (``FORWARDED``),
    else None; ``state`` is this delivery's (its ``daemon_id``, None if not known).
    When an earlier delivery went to another desktop, or to one not known, the recorded
    ``daemon_id`` becomes :data:`MIXED` (and stays so), and the flag is True: that
    desktop may have started the job. The Redis mark script (``_redis_jobs._MARK``)
    does the same. A ``running`` report of an earlier delivery is kept.
    """
    if before is None:
        return state, False
    if before.running:
        state = attrs.evolve(state, running=True)
    if before.daemon_id not in (None, MIXED) and before.daemon_id == state.daemon_id:
        return state, False
    return attrs.evolve(state, daemon_id=MIXED), True


class InvalidTransition(ValueError):
    """A stage change the table does not allow (a bug in the caller, never user input)."""


class MalformedState(ValueError):
    """Stored text that is not a job state."""


def check_transition(old: Stage, new: Stage) -> None:
    """Raise :class:`InvalidTransition` unless ``new`` may follow ``old``."""
    if new not in TRANSITIONS[old]:
        raise InvalidTransition(f"job stage {old} cannot become {new}")


@attrs.frozen
class JobState:
    """What is known about one job.

    Attributes:
        stage: where the job is.
        user_id: whose desktop the job is for (a cancel finds the stream from it).
        at: when the stage was entered, Unix seconds (wall clock of the writer), if known.
        session_id: the hub session a ``delivered`` job was forwarded on.
        reply_to: the caller's notification mailbox (a ``queued`` job: a cancel answers
            the waiting caller through it).
        daemon_id: the desktop (``hello.daemon_id``) every delivery of the job went to,
            ``?`` (:data:`MIXED`) once deliveries went to more than one desktop or to
            one not known (a desktop's "I never started it" then does not mean it did
            not run); None: not recorded (never delivered, or an older writer).
        idempotency_key: the caller's key of a ``queued`` job (its submit writes it):
            an answer written once the entry's fields are gone (``lost`` for a trimmed
            or deleted entry, a cancel of a queued job) names the key's record with it,
            so the answer is kept as long as the record. None: no key (or an older
            writer); a stage of the delivery is written without it.
        running: the desktop reported this job ``running`` (``progress.stage``: the tool
            may run) on a delivery: it may have acted. False: no such report reached the
            hub, so the job is only known to have been delivered, not to have started
            (it may still have: no sidecar reports ``running`` for a tool that needs no
            approval, docs/architecture.md "What a job's stage claims"). Kept by every
            later stage of the delivery and by a redelivery (the substrates' finish and
            mark steps); stored only when True.
    """

    stage: Stage = attrs.field(converter=Stage)
    user_id: str
    at: float | None = None
    session_id: str | None = None
    reply_to: str | None = None
    daemon_id: str | None = None
    idempotency_key: str | None = None
    running: bool = False

    def advance(
        self, stage: Stage, *, at: float | None = None, session_id: str | None = None
    ) -> JobState:
        """The state after moving to ``stage``.

        Raises:
            InvalidTransition: the table does not allow it.
        """
        check_transition(self.stage, stage)
        return attrs.evolve(self, stage=stage, at=at, session_id=session_id or self.session_id)

    def encode(self) -> str:
        """The stored JSON text (fields that are None are left out)."""
        body: dict[str, str | float | bool] = {
            "stage": self.stage.value,
            "user_id": self.user_id,
        }
        if self.at is not None:
            body["at"] = self.at
        if self.session_id is not None:
            body["session_id"] = self.session_id
        if self.reply_to is not None:
            body["reply_to"] = self.reply_to
        if self.daemon_id is not None:
            body["daemon_id"] = self.daemon_id
        if self.idempotency_key is not None:
            body["idempotency_key"] = self.idempotency_key
        if self.running:
            body["running"] = True
        return json.dumps(body, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | bytes) -> JobState:
        """Parse stored text.

        Raises:
            MalformedState: not a JSON object with a known ``stage`` and a ``user_id``.
        """
        try:
            body = json.loads(text)
            return cls(
                stage=Stage(body["stage"]),
                user_id=str(body["user_id"]),
                at=None if body.get("at") is None else float(body["at"]),
                session_id=body.get("session_id"),
                reply_to=body.get("reply_to"),
                daemon_id=body.get("daemon_id"),
                idempotency_key=body.get("idempotency_key"),
                running=body.get("running") is True,
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise MalformedState(f"not a job state: {str(text)[:80]!r} ({exc})") from None
