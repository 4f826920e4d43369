"""Consent (issue 12 item 5): a tool marked ``needs_approval`` waits on the desktop for
the person's approve/decline, up to its deadline; nothing is approved by default. Real
files and the real clock (decisions are files the CLI writes); every wait bounded."""

from __future__ import annotations

import pytest
import trio
from deskbridge_common import Progress
from deskbridge_sidecar import needs_approval, tool
from deskbridge_sidecar._consent import approvals_dir, decide, pending
from deskbridge_sidecar.cli import main

DEADLINE_S = 30


def gated_tool():
    calls: list[str] = []

    @needs_approval
    @tool(side_effects=True)
    async def pay(invoice: str) -> dict:
        calls.append(invoice)
        return {"paid": invoice}

    return pay, calls


async def _requested(data_dir, job_id) -> None:
    while not (approvals_dir(data_dir) / f"{job_id}.json").exists():  # noqa: ASYNC110
        await trio.sleep(0.02)


async def test_approve_runs_decline_refuses_and_is_remembered(start_daemon, tmp_path, wall):
    pay, calls = gated_tool()
    with trio.fail_after(DEADLINE_S):
        daemon, s = await start_daemon(tools=[pay], data_dir=tmp_path)
        first = await s.send_job("pay", {"invoice": "A-1"}, key="k-a", job_id="job-a")
        await _requested(tmp_path, "job-a")
        assert calls == [] and [r["tool"] for r in pending(tmp_path)] == ["pay"]
        decide(tmp_path, "job-a", approve=True)
        assert (await s.wait_result(first.id)).result == {"paid": "A-1"}

        second = await s.send_job("pay", {"invoice": "B-2"}, key="k-b", job_id="job-b")
        await _requested(tmp_path, "job-b")
        assert main(["decline", "job-b", "--data-dir", str(tmp_path)]) == 0  # the CLI
        refused = await s.wait_result(second.id)
        again = await s.call("pay", {"invoice": "B-2"}, key="k-b", job_id="job-b")
    assert refused.error.code == "declined" and again.error.code == "declined"
    assert calls == ["A-1"]  # B-2 never ran, not even on redelivery
    assert pending(tmp_path) == []


async def test_nothing_is_approved_by_default_the_deadline_ends_the_wait(
    start_daemon, tmp_path, wall
):
    pay, calls = gated_tool()
    with trio.fail_after(DEADLINE_S):
        daemon, s = await start_daemon(tools=[pay], data_dir=tmp_path)
        result = await s.call("pay", {"invoice": "C"}, key="k-c", deadline=wall() + 1.0)
    assert result.error.code == "expired" and "awaited approval" in result.error.message
    assert calls == [] and pending(tmp_path) == []


async def test_without_a_data_dir_there_is_no_one_to_ask(start_daemon):
    pay, calls = gated_tool()
    with trio.fail_after(DEADLINE_S):
        daemon, s = await start_daemon(tools=[pay])
        result = await s.call("pay", {"invoice": "D"}, key="k-d")
    assert result.error.code == "declined" and calls == []


def test_pending_with_nothing_waiting_says_so_on_stderr(tmp_path, capsys):
    assert main(["pending", "--data-dir", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "no job is waiting for approval" in err


def test_deciding_an_unknown_job_says_so(tmp_path, capsys):
    assert main(["approve", "nope", "--data-dir", str(tmp_path)]) == 1
    assert "no job 'nope' is waiting for approval" in capsys.readouterr().err


# -- the rule and the stage reports, on MockClock with a MemoryDesk -------------------------


def stale_tool(after_wait_s: float):
    calls: list[str] = []

    @needs_approval(after_wait_s=after_wait_s)
    @tool(side_effects=True)
    async def submit(form: str) -> dict:
        calls.append(form)
        return {"submitted": form}

    return submit, calls


def test_the_declaration_is_in_the_catalogue_entry_whichever_side_of_tool_it_is():
    from deskbridge_sidecar import ToolRegistry

    @tool
    @needs_approval(after_wait_s=60)
    async def below() -> None: ...

    @needs_approval
    @tool
    async def above() -> None: ...

    specs = {s.name: s for s in ToolRegistry([below, above]).specs()}
    assert specs["below"].approval_after_wait_s == 60.0
    assert specs["above"].approval_after_wait_s == 0.0
    assert specs["echo"].approval_after_wait_s is None


def test_a_negative_or_endless_wait_is_refused_at_declaration():
    import pytest

    for bad in (-1, float("inf"), float("nan"), True):
        with pytest.raises(ValueError, match="after_wait_s must be a finite number >= 0"):
            needs_approval(after_wait_s=bad)


async def test_the_hubs_waited_s_decides_whether_a_stale_job_is_asked(
    start_daemon, autojump_clock
):
    from deskbridge_sidecar.testing import MemoryDesk

    submit, calls = stale_tool(after_wait_s=60)
    desk = MemoryDesk()
    daemon, s = await start_daemon(tools=[submit], approvals=desk)
    fresh = await s.call("submit", {"form": "f"}, timeout_s=300, waited_s=59.0)
    assert fresh.ok and calls == ["f"] and desk.asked == 0  # 59 s < 60 s: not asked
    assert [p.stage for p in s.frames(Progress)] == []  # nothing to report either
    stale = await s.send_job("submit", {"form": "s"}, job_id="job-s", timeout_s=300,
                             waited_s=60.0)  # fmt: skip
    with trio.fail_after(5):
        request = await desk.wait_requested("job-s")
    assert (request.tool, request.args, request.waited_s) == ("submit", {"form": "s"}, 60.0)
    await s.wait_for(lambda: s.frames(Progress))
    (asking,) = s.frames(Progress)
    assert (asking.id, asking.stage, asking.progress) == (stale.id, "awaiting_approval", 0.0)
    assert asking.message == "awaiting approval: deskbridge-sidecar approve job-s"
    await trio.sleep(1)  # past the progress rate limit, so the next report goes at once
    desk.approve("job-s")
    assert (await s.wait_result(stale.id)).result == {"submitted": "s"}
    assert [p.stage for p in s.frames(Progress)] == ["awaiting_approval", "running"]
    assert calls == ["f", "s"]


async def test_time_queued_on_the_desktop_counts_as_waiting(start_daemon, autojump_clock):
    """Behind a 61 s tool, a job the hub sent fresh has waited 61 s when it could start."""
    from deskbridge_sidecar.testing import MemoryDesk

    submit, calls = stale_tool(after_wait_s=60)
    desk = MemoryDesk()
    daemon, s = await start_daemon(tools=[submit], approvals=desk)
    await s.send_job("sleep", {"seconds": 61}, timeout_s=300, waited_s=0.0)
    queued = await s.send_job("submit", {"form": "q"}, job_id="job-q", timeout_s=300,
                              waited_s=0.0)  # fmt: skip
    with trio.fail_after(70):
        request = await desk.wait_requested("job-q")
    assert 61.0 <= request.waited_s < 62.0 and calls == []
    desk.decline("job-q")
    result = await s.wait_result(queued.id)
    assert result.error.code == "declined" and calls == []


async def test_a_cancel_while_awaiting_approval_withdraws_the_request(
    start_daemon, autojump_clock
):
    from deskbridge_sidecar.testing import MemoryDesk

    pay, calls = gated_tool()
    desk = MemoryDesk()
    daemon, s = await start_daemon(tools=[pay], approvals=desk)
    job = await s.send_job("pay", {"invoice": "x"}, job_id="job-x", timeout_s=300)
    with trio.fail_after(5):
        await desk.wait_requested("job-x")
    await s.cancel(job.id)
    result = await s.wait_result(job.id)
    assert result.error.code == "cancelled" and desk.requests == {} and calls == []


# -- the command the person is told to type (security review) ------------------------------

#: Caller-chosen job ids the hub accepts (``A-Z a-z 0-9 . _ ~ : @ ! $ & ' ( ) * + , ; = -``)
#: that a shell reads as more than one word: pasted as shown, each ran ``echo PWNED``.
HOSTILE_JOB_IDS = [
    "x;echo$IFS'PWNED'",
    "x&&echo$IFS$(echo$IFS'PWNED')",
    "$(echo$IFS'PWNED')",
    "-h",
]


def _typed(command: str) -> list[str]:
    """The words a POSIX shell passes to ``deskbridge-sidecar`` for ``command`` (the
    program replaced by ``printf``; a real ``sh``, bounded)."""
    import subprocess

    assert command.startswith("deskbridge-sidecar ")
    script = "printf '%s\\n' " + command.removeprefix("deskbridge-sidecar ")
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=10)
    return done.stdout.splitlines()


@pytest.mark.parametrize("job_id", HOSTILE_JOB_IDS)
async def test_the_suggested_approve_command_quotes_the_job_id(
    tmp_path, monkeypatch, caplog, job_id
):
    """The log line, the desktop notification and the stage message tell the person to
    run ``deskbridge-sidecar approve JOB_ID``; the job id is the caller's choice and was
    shown unquoted, so pasting the command ran the caller's shell code."""
    import logging
    import re

    from deskbridge_sidecar import _consent

    notified: list[list[str]] = []

    async def fake_run_process(command, **_):
        notified.append(command)

    monkeypatch.setattr(_consent.sys, "platform", "linux")
    monkeypatch.setattr(_consent.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(_consent.trio, "run_process", fake_run_process)
    request = _consent.ApprovalRequest(job_id, "pay", {}, deadline=0.0, waited_s=0.0)
    with caplog.at_level(logging.WARNING, logger="deskbridge"):
        assert await _consent.wait_for_decision(tmp_path, request, lambda: 1.0) is None
    shown = [(r.getMessage(), ("approve", "decline")) for r in caplog.records]
    shown.append((notified[0][-1], ("approve", "decline")))
    stage = getattr(_consent, "awaiting_message", None)  # the stage report's (the fix's)
    shown.append((stage(job_id) if stage else "", ("approve",)))
    for text, verbs in shown:
        for verb in verbs:
            match = re.search(rf"(deskbridge-sidecar {verb} .+?)(?:  \(or |\)$|$)", text)
            assert match, text
            words = _typed(match.group(1))
            assert words[-1] == job_id and words[0] == verb, (text, words)
            assert "PWNED" not in words and len(words) <= 3, words  # verb, [--], job id


def test_pending_lists_a_hostile_job_id_as_one_shell_word(tmp_path, capsys):
    """``pending`` is where the person copies a job id from: it was printed raw."""
    from deskbridge_sidecar import _consent

    job_id = HOSTILE_JOB_IDS[0]
    folder = approvals_dir(tmp_path)
    request = _consent.ApprovalRequest(job_id, "pay", {"a": 1}, deadline=2e9, waited_s=0.0)
    _consent._write_request(folder, folder / f"{job_id}.json", request.to_json())
    assert main(["pending", "--data-dir", str(tmp_path)]) == 0
    word = capsys.readouterr().out.split("  ")[0]
    assert _typed(f"deskbridge-sidecar approve {word}") == ["approve", job_id]
