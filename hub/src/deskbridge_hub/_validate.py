"""Validation of identifiers before they reach a Redis key or a log line."""

from __future__ import annotations

import re

#: The rules as anchored regular expressions (the OpenAPI document's ``pattern``s).
USER_ID_PATTERN = r"^[A-Za-z0-9_.@:-]{1,128}$"
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
KEY_PATTERN = r"^[\x21-\x7e]{1,200}$"
#: A job id also is not ``.`` or ``..`` (``validate_job_id``).
JOB_ID_PATTERN = r"^(?!\.\.?$)[A-Za-z0-9._~:@!$&'()*+,;=-]{1,200}$"
_USER_ID = re.compile(USER_ID_PATTERN[1:-1])
_TOOL_NAME = re.compile(TOOL_NAME_PATTERN[1:-1])
_KEY = re.compile(KEY_PATTERN[1:-1])


def validate_user_id(user_id: object, field: str = "user_id") -> str:
    """Return ``user_id`` if it is 1-128 of ``[A-Za-z0-9_.@:-]``.

    Args:
        user_id: the value to check.
        field: the name the error message gives it.

    Raises:
        ValueError: it is not a string or has other characters or length.
    """
    if not isinstance(user_id, str) or not _USER_ID.fullmatch(user_id):
        raise ValueError(f"{field} must be 1-128 characters of A-Z a-z 0-9 _ . @ : -")
    return user_id


def validate_tool_name(name: object, field: str = "name") -> str:
    """Return ``name`` if it is 1-64 of ``[A-Za-z0-9_.-]``; else raise ValueError (its
    message names ``field``)."""
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
        raise ValueError(f"{field} must be 1-64 characters of A-Z a-z 0-9 _ . -")
    return name


def validate_key(key: object, field: str = "idempotency_key") -> str:
    """Return ``key`` if it is 1-200 printable ASCII characters without spaces; else raise
    ValueError (its message names ``field``: a job id is checked by the same rule)."""
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise ValueError(f"{field} must be 1-200 printable ASCII characters without spaces")
    return key


_JOB_ID = re.compile(JOB_ID_PATTERN)


def validate_job_id(job_id: object, field: str = "job_id") -> str:
    """Return a caller-chosen ``job_id`` if it is 1-200 characters a URL path segment
    carries as they are (RFC 3986 ``pchar`` without ``%``: ``A-Z a-z 0-9 . _ ~ : @ ! $ &
    ' ( ) * + , ; = -``) and not ``.`` or ``..``; else raise ValueError naming ``field``.
    ``/v1/jobs/a/b`` matches no route, ``?`` and ``#`` end the path, ``%2e%2e`` and dot
    segments are resolved away by clients: such a job could never be read, cancelled or
    followed."""
    if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id) or job_id in (".", ".."):
        raise ValueError(
            f"{field} must be 1-200 characters of A-Z a-z 0-9 . _ ~ : @ ! $ & ' ( ) * + , ; = -"
            " (a URL path segment as it is), not . or .."
        )
    return job_id
