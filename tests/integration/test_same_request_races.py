"""Races between copies of one request across hub workers: real Redis, `deskbridge-hub
serve --workers 2`, a real sidecar process with the counting tool. The same request
(the same idempotency key, with or without a caller-chosen ``job_id``) sent several
times at the same instant, each copy on a fresh connection (so both workers take
some): the tool runs once per key, and every copy gets that job's answer."""

from __future__ import annotations

import secrets
import threading

import pytest

from tests.procs import Hub, Ledger, Sidecar, api, issue, running, wait_until

pytestmark = pytest.mark.integration

COPIES = 6
ROUNDS = 6


def _send_at_once(url: str, body: dict) -> list[tuple[int, dict]]:
    """POST ``body`` from ``COPIES`` threads released together; each answer, bounded."""
    answers: list[tuple[int, dict]] = []
    gate = threading.Barrier(COPIES)

    def one() -> None:
        with api() as client:
            gate.wait(timeout=30)
            r = client.post(url, json=body)
            answers.append((r.status_code, r.json()))

    threads = [threading.Thread(target=one) for _ in range(COPIES)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a copy got no answer within 60 s"
    return answers


def test_copies_of_one_request_run_once_and_share_the_answer(tmp_path):
    user = "it-" + secrets.token_hex(4)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    hub = Hub(tmp_path, workers=2)
    with running(hub):
        hub.wait_healthy()
        sidecar = Sidecar(
            tmp_path, hub.ws, issue(user), tools=["counting_tools"], env=ledger.env()
        )
        with running(sidecar), api() as client:
            url = f"{hub.http}/v1/users/{user}"
            wait_until(
                lambda: client.get(url + "/presence").json()["online"],
                timeout_s=15,
                what="presence online",
            )
            keys = []
            for r in range(ROUNDS):
                key = f"k-{r}-{secrets.token_hex(3)}"
                keys.append(key)
                body = {
                    "name": "record",
                    "args": {"key": key, "seconds": 0.2},
                    "idempotency_key": key,
                    "timeout_s": 30,
                }
                if r % 2 == 0:  # a caller-chosen id too: its copies are not "another job"
                    body["job_id"] = key
                answers = _send_at_once(url + "/jobs", body)
                assert {status for status, _ in answers} == {200}, answers
                assert {a["status"] for _, a in answers} == {"completed"}, answers
                job_ids = {a["job_id"] for _, a in answers}
                assert len(job_ids) == 1, answers
                if r % 2 == 0:
                    assert job_ids == {key}
            assert ledger.counts() == {key: 1 for key in keys}
