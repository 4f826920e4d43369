"""JSON codec for the v1 frames: strict in what it accepts, exact in what it emits.

``decode_frame`` turns one WebSocket text message into a frame or raises
:class:`RemoteProtocolError` naming the field; ``encode_frame`` turns a frame into text
and raises :class:`LocalProtocolError` if the frame would not survive ``decode_frame``.
Both run the same spec table: the encoder checks the frame's fields as Python values
before serialising, once, and never parses its own output. No I/O.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

import attrs

from ._codes import CLOSE_MESSAGE_TOO_BIG, CLOSE_POLICY_VIOLATION
from ._errors import LocalProtocolError, RemoteProtocolError
from ._frames import (
    DESK_STAGES,
    Cancel,
    Error,
    Frame,
    Hello,
    Job,
    JobError,
    JobResult,
    Ping,
    Pong,
    Progress,
    RawJSON,
    Sleeping,
    ToolSpec,
    Welcome,
)
from ._strict_json import DuplicateKey
from ._strict_json import loads as _strict_loads

#: Largest frame accepted or sent, in bytes of UTF-8 (1 MiB; issue 2).
MAX_FRAME_BYTES = 1024 * 1024
#: Longest ``traceparent`` accepted (W3C Trace Context: 55 characters for version 00;
#: later versions may append fields).
MAX_TRACEPARENT_CHARS = 256
#: Longest id-like string (delivery ids, job ids, idempotency keys, nonces).
MAX_ID_CHARS = 200
#: Most tools one sidecar may announce.
MAX_TOOLS = 256
#: Longest ``progress.message``, in characters (a status line, not a log).
MAX_PROGRESS_MESSAGE_CHARS = 1024

_Check = Callable[[str, Any], Any]


def _str(limit: int = MAX_ID_CHARS, *, nonempty: bool = True) -> _Check:
    def check(field: str, value: Any) -> str:
        if not isinstance(value, str):
            raise RemoteProtocolError(field, f"expected string, got {_kind(value)}")
        if nonempty and not value:
            raise RemoteProtocolError(field, "must not be empty")
        if len(value) > limit:
            raise RemoteProtocolError(field, f"longer than {limit} characters")
        return value

    return check


def _text(field: str, value: Any) -> str:
    text: str = _str(MAX_FRAME_BYTES, nonempty=False)(field, value)
    return text


def _bool(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise RemoteProtocolError(field, f"expected boolean, got {_kind(value)}")
    return value


def _int(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RemoteProtocolError(field, f"expected integer, got {_kind(value)}")
    return value


def _number(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RemoteProtocolError(field, f"expected number, got {_kind(value)}")
    if not math.isfinite(value):
        raise RemoteProtocolError(field, "must be finite")
    return float(value)


def _non_negative(field: str, value: Any) -> float:
    number = _number(field, value)
    if number < 0:
        raise RemoteProtocolError(field, "must not be negative")
    return number


def _positive(field: str, value: Any) -> float:
    number = _number(field, value)
    if number <= 0:
        raise RemoteProtocolError(field, "must be positive")
    return number


def _nonnegative(field: str, value: Any) -> float:
    number = _number(field, value)
    if number < 0:
        raise RemoteProtocolError(field, "must not be negative")
    return number


def _object(field: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RemoteProtocolError(field, f"expected object, got {_kind(value)}")
    return value


def _any(field: str, value: Any) -> Any:
    return value


def _desk_stage(field: str, value: Any) -> str:
    stage: str = _str(32)(field, value)
    if stage not in DESK_STAGES:
        raise RemoteProtocolError(field, f"not one of {sorted(DESK_STAGES)}")
    return stage


def _job_error(field: str, value: Any) -> JobError:
    obj = _object(field, value)
    fields = _fields(obj, {"code": (_str(64), True), "message": (_text, True)}, prefix=field)
    return JobError(**fields)


def _tool_spec(field: str, value: Any) -> ToolSpec:
    obj = _object(field, value)
    spec = {
        "name": (_str(64), True),
        "description": (_str(4096, nonempty=False), False),
        "args_schema": (_object, False),
        "side_effects": (_bool, False),
        "approval_after_wait_s": (_non_negative, False),
    }
    return ToolSpec(**_fields(obj, spec, prefix=field))


def _tools(field: str, value: Any) -> tuple[ToolSpec, ...]:
    if not isinstance(value, list):
        raise RemoteProtocolError(field, f"expected array, got {_kind(value)}")
    if len(value) > MAX_TOOLS:
        raise RemoteProtocolError(field, f"more than {MAX_TOOLS} tools")
    tools = tuple(_tool_spec(f"{field}[{i}]", item) for i, item in enumerate(value))
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise RemoteProtocolError(field, "duplicate tool name")
    return tools


# One table: frame type -> (class, {field: (check, required)}).
_SPECS: dict[str, tuple[type, dict[str, tuple[_Check, bool]]]] = {
    "hello": (
        Hello,
        {
            "protocol_version": (_int, True),
            "sidecar_version": (_str(64), True),
            "tools": (_tools, False),
            "daemon_id": (_str(), False),
            "slept_s": (_non_negative, False),
        },
    ),
    "welcome": (
        Welcome,
        {
            "session_id": (_str(), True),
            "heartbeat_s": (_positive, True),
            "ping_interval_s": (_positive, True),
            "ping_timeout_s": (_positive, True),
        },
    ),
    "job": (
        Job,
        {
            "id": (_str(), True),
            "job_id": (_str(), True),
            "name": (_str(64), True),
            "args": (_object, True),
            "idempotency_key": (_str(), True),
            "deadline": (_number, True),
            "timeout_s": (_non_negative, False),
            "traceparent": (_str(MAX_TRACEPARENT_CHARS), False),
            "waited_s": (_non_negative, False),
        },
    ),
    "job_result": (
        JobResult,
        {
            "id": (_str(), True),
            "ok": (_bool, True),
            "result": (_any, False),
            "error": (_job_error, False),
        },
    ),
    "progress": (
        Progress,
        {
            "id": (_str(), True),
            "progress": (_number, True),
            "total": (_nonnegative, False),
            "message": (_str(MAX_PROGRESS_MESSAGE_CHARS, nonempty=False), False),
            "stage": (_desk_stage, False),
        },
    ),
    "cancel": (Cancel, {"id": (_str(), True)}),
    "sleeping": (Sleeping, {}),
    "ping": (Ping, {"nonce": (_str(), True)}),
    "pong": (Pong, {"nonce": (_str(), True)}),
    "error": (Error, {"code": (_str(64), True), "message": (_text, True)}),
}

FRAME_TYPES = frozenset(_SPECS)


def _kind(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(value), "null" if value is None else "number"
    )


def _fields(
    obj: dict[str, Any], spec: dict[str, tuple[_Check, bool]], *, prefix: str = ""
) -> dict[str, Any]:
    def name(key: str) -> str:
        return f"{prefix}.{key}" if prefix else key

    for key in obj:
        if key not in spec:
            raise RemoteProtocolError(name(key), "unexpected field", CLOSE_POLICY_VIOLATION)
    out: dict[str, Any] = {}
    for key, (check, required) in spec.items():
        if key in obj:
            out[key] = check(name(key), obj[key])
        elif required:
            raise RemoteProtocolError(name(key), "missing", CLOSE_POLICY_VIOLATION)
    return out


#: The canonical text of a ping or pong whose nonce needs no JSON escaping (what
#: :func:`encode_frame` writes for it, and what both ends send): decoded and encoded
#: without the JSON parser, the checks and the frame table. An idle desktop is a ping
#: and a pong every interval; at 10,000 desktops the general path was ~10 % of an idle
#: hub's CPU (issue 10). Any other text of a ping takes the general path, with the same
#: result (``tests/common/test_codec.py`` checks both ways).
_CANONICAL_PING_PONG = re.compile(r'\{"type":"(ping|pong)","nonce":"([A-Za-z0-9_.:\-]{1,200})"\}')
_PLAIN_NONCE = re.compile(r"[A-Za-z0-9_.:\-]{1,200}")


def decode_frame(data: str | bytes) -> Frame:
    """Parse one WebSocket message into a frame.

    Args:
        data: the message as text (or UTF-8 bytes), at most ``MAX_FRAME_BYTES`` bytes.

    Returns:
        One of the frame classes in ``deskbridge_common.Frame``.

    Raises:
        RemoteProtocolError: the message is too big (close 1009), not UTF-8 or JSON or not
            an object, has an object with a repeated key, or has a wrong-typed field
            (1007), or has an unknown ``type``, an unexpected or a missing field (1008).
            ``field`` names the culprit.
    """
    if type(data) is str and len(data) <= 240:  # noqa: E721 - exactly str, not a subclass
        canonical = _CANONICAL_PING_PONG.fullmatch(data)
        if canonical is not None:
            kind, nonce = canonical.groups()
            return Ping(nonce) if kind == "ping" else Pong(nonce)
    size = len(data) if isinstance(data, bytes) else len(data.encode("utf-8", "surrogatepass"))
    if size > MAX_FRAME_BYTES:
        raise RemoteProtocolError(
            "$", f"frame of {size} bytes exceeds {MAX_FRAME_BYTES}", CLOSE_MESSAGE_TOO_BIG
        )
    try:
        obj = _strict_loads(data, parse_constant=_reject_constant, parse_float=_finite_float)
    except DuplicateKey as exc:  # readers keeping the first or the last value disagree
        raise RemoteProtocolError(exc.field, str(exc)) from None
    except (ValueError, RecursionError) as exc:
        raise RemoteProtocolError("$", f"not valid JSON ({type(exc).__name__})") from None
    if not isinstance(obj, dict):
        raise RemoteProtocolError("$", f"expected a JSON object, got {_kind(obj)}")
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise RemoteProtocolError("type", "missing or not a string", CLOSE_POLICY_VIOLATION)
    if kind not in _SPECS:
        raise RemoteProtocolError(
            "type", f"unknown frame type {kind[:32]!r}", CLOSE_POLICY_VIOLATION
        )
    cls, spec = _SPECS[kind]
    body = {k: v for k, v in obj.items() if k != "type"}
    fields = _fields(body, spec)
    if cls is JobResult:
        _check_result_shape(fields)
    frame: Frame = cls(**fields)
    return frame


def _check_result_shape(fields: dict[str, Any]) -> None:
    if fields["ok"] and "error" in fields:
        raise RemoteProtocolError("error", "must be absent when ok is true", CLOSE_POLICY_VIOLATION)
    if not fields["ok"]:
        if "error" not in fields:
            raise RemoteProtocolError("error", "missing (ok is false)", CLOSE_POLICY_VIOLATION)
        if "result" in fields:
            raise RemoteProtocolError(
                "result", "must be absent when ok is false", CLOSE_POLICY_VIOLATION
            )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 overflows to inf: refused like Infinity
        raise ValueError("number out of range")
    return value


#: Types that go to ``json.dumps`` as they are (most frame fields are strings).
_PLAIN = frozenset({str, int, float, bool, dict, list, type(None)})
#: Field names of each attrs class met here, in definition order (``attrs.fields``).
_NAMES: dict[type, tuple[str, ...]] = {}


def _items(value: Any) -> list[tuple[str, Any]]:
    """``attrs.asdict(value, recurse=False).items()`` without building the dict: the
    field names are looked up once per class."""
    cls = type(value)
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(a.name for a in attrs.fields(cls))
    return [(name, getattr(value, name)) for name in names]


def _to_wire(value: Any) -> Any:
    """A frame field as JSON-ready data: attrs values (ToolSpec, JobError) become objects,
    tuples of them arrays. Plain data (``args``, ``result``) is left for ``json.dumps``,
    not walked here (a deeply nested result must not recurse in Python)."""
    if type(value) in _PLAIN:
        return value
    if isinstance(value, RawJSON):
        return json.loads(value.text)
    if attrs.has(type(value)):  # a nested value's unset optional fields are left out
        return {k: _to_wire(v) for k, v in _items(value) if v is not None}
    if isinstance(value, tuple):
        return [_to_wire(v) for v in value]
    return value


def _body(frame: Frame) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for key, value in _items(frame):
        if value is None and isinstance(frame, Progress | JobResult | Job | Hello):
            continue  # optional fields left out when unset
        plain = isinstance(value, RawJSON) or key in ("args", "result", "args_schema")
        body[key] = value if plain else _to_wire(value)
    if isinstance(frame, JobResult):
        body.pop("error" if frame.ok else "result", None)
        if frame.ok and "result" not in body:
            body["result"] = None
    return body


def frame_to_dict(frame: Frame) -> dict[str, Any]:
    """Return the JSON object for ``frame`` (optional fields left out when unset; a
    :class:`RawJSON` result parsed back into its value)."""
    body = _body(frame)
    return {"type": frame.type, **{k: _to_wire(v) for k, v in body.items()}}


def encode_frame(frame: Frame) -> str:
    """Serialise ``frame`` to one WebSocket text message, once.

    The fields are checked as Python values against the same spec table
    :func:`decode_frame` uses; the JSON text is produced once and not parsed again. A
    ``job_result`` whose ``result`` is a :class:`RawJSON` has that text spliced in as is.

    Returns:
        Compact JSON text (ASCII unless a :class:`RawJSON` brings other characters).

    Raises:
        LocalProtocolError: the frame is not JSON-serialisable, over ``MAX_FRAME_BYTES``,
            or would be refused by :func:`decode_frame` (``field`` names why, and
            ``close_code`` is the code the peer would close with).
    """
    if isinstance(frame, Ping | Pong) and _PLAIN_NONCE.fullmatch(frame.nonce):
        return f'{{"type":"{frame.type}","nonce":"{frame.nonce}"}}'  # see _CANONICAL_PING_PONG
    body = _body(frame)
    raw = body.pop("result", None) if isinstance(body.get("result"), RawJSON) else None
    _cls, spec = _SPECS[frame.type]
    try:
        checked = _fields(body if raw is None else {**body, "result": None}, spec)
        if isinstance(frame, JobResult):
            _check_result_shape(checked)
    except RemoteProtocolError as exc:
        raise LocalProtocolError(exc.field, str(exc).split(": ", 1)[-1], exc.close_code) from None
    try:
        text = json.dumps({"type": frame.type, **body}, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise LocalProtocolError("$", f"not JSON-serialisable: {exc}") from None
    except RecursionError:
        raise LocalProtocolError("$", "nested too deeply to encode") from None
    if raw is not None:
        text = f'{text[:-1]},"result":{raw.text}}}'
    size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_FRAME_BYTES:
        raise LocalProtocolError(
            "$", f"frame of {size} bytes exceeds {MAX_FRAME_BYTES}", CLOSE_MESSAGE_TOO_BIG
        )
    return text


__all__ = [
    "FRAME_TYPES",
    "MAX_FRAME_BYTES",
    "MAX_ID_CHARS",
    "MAX_PROGRESS_MESSAGE_CHARS",
    "MAX_TOOLS",
    "decode_frame",
    "encode_frame",
    "frame_to_dict",
]
