"""An ``in_doubt`` answer's advice fits the call: one that had an idempotency key is told
the key is spent (retry with a new key), one that had none (its key is its job id) is
not told of a key it never gave. Before: every answer said "Not run again under this
idempotency key" or "retry with a new idempotency key"."""

from __future__ import annotations

import trio
import trio.testing
from deskbridge_sidecar._ledger import Ledger

from .runner_kit import counting, job, make


async def _interrupted_message(nursery, key: str, job_id: str) -> str:
    submit, _ = counting(seconds=100)
    runner = make(nursery, submit, ledger=Ledger.memory())
    answers = []

    async def deliver() -> None:
        answers.append(await runner.execute(job(key=key, job_id=job_id)))

    nursery.start_soon(deliver)
    await trio.testing.wait_all_tasks_blocked()
    runner.close()
    runner.interrupt("the sidecar was stopped (SIGTERM)")
    await runner.wait_idle()
    await trio.testing.wait_all_tasks_blocked()
    (answer,) = answers
    assert answer.error is not None and answer.error.code == "in_doubt"
    return answer.error.message


async def test_an_interrupted_call_without_a_key_is_not_told_of_one(autojump_clock, nursery):
    message = await _interrupted_message(nursery, key="job-7", job_id="job-7")
    assert "idempotency key" not in message and "new key" not in message
    assert "it may have acted. Not run again: check, then call again if it should run" in message


async def test_an_interrupted_call_with_a_key_is_told_the_key_is_spent(autojump_clock, nursery):
    message = await _interrupted_message(nursery, key="order-42", job_id="job-7")
    assert "Not run again under this idempotency key: check, then retry with a new key" in message


def _recovered_message(tmp_path, key: str, job_id: str) -> str:
    path = tmp_path / "ledger.db"
    ledger = Ledger.open(path, wall_clock=lambda: 1_700_000_000.0)
    trio.run(ledger.begin, key, "click", "d", 1_700_000_600.0, job_id)
    ledger._conn.close()  # dies mid-job
    again = Ledger.open(path, wall_clock=lambda: 1_700_000_060.0)
    entry = trio.run(again.get, key)
    again.close()
    assert entry.outcome.error is not None
    return entry.outcome.error.message


def test_a_recovered_row_without_a_key_is_not_told_of_one(tmp_path):
    message = _recovered_message(tmp_path, key="job-7", job_id="job-7")
    assert "idempotency key" not in message
    assert message.endswith("Not run again: check, then call again if it should run")


def test_a_recovered_row_with_a_key_is_told_to_use_a_new_one(tmp_path):
    message = _recovered_message(tmp_path, key="order-42", job_id="job-7")
    assert message.endswith(
        "Not run again: check, then retry with a new idempotency key if it should run"
    )
