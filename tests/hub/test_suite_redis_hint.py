"""A newcomer's ``./dev test`` without the suite's Redis: hundreds of connection errors
and nothing saying what to start. The report header and, after failures, the summary now
say it in one line (``tests/conftest.py``)."""

from __future__ import annotations

import socket

from ..conftest import REDIS_URL, redis_problem


def test_a_redis_that_does_not_answer_is_named_with_what_to_start() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connections are refused
    problem = redis_problem(f"redis://127.0.0.1:{port}/0")
    assert problem is not None
    assert problem.startswith(f"the suite's Redis at 127.0.0.1:{port} does not answer (")
    assert "DESKBRIDGE_TEST_REDIS_URL=redis://127.0.0.1:6390/0" in problem


def test_the_suites_redis_answers() -> None:
    assert redis_problem(REDIS_URL) is None
