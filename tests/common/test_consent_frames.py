"""The wire fields consent added (issue 12 item 5), exactly: ``progress.stage``,
``job.waited_s`` and a catalogue entry's ``approval_after_wait_s``. Pure, no event loop."""

from __future__ import annotations

import json

import pytest
from deskbridge_common import (
    CLOSE_INVALID_PAYLOAD,
    DESK_STAGES,
    STAGE_AWAITING_APPROVAL,
    STAGE_RUNNING,
    Hello,
    Job,
    LocalProtocolError,
    Progress,
    RemoteProtocolError,
    ToolSpec,
    decode_frame,
    encode_frame,
)


def test_the_desk_stages_are_exactly_awaiting_approval_and_running():
    assert (STAGE_AWAITING_APPROVAL, STAGE_RUNNING) == ("awaiting_approval", "running")
    assert DESK_STAGES == {"awaiting_approval", "running"}


@pytest.mark.parametrize("stage", ["awaiting_approval", "running"])
def test_a_progress_stage_round_trips(stage):
    text = encode_frame(Progress("d", 0.0, message="m", stage=stage))
    assert json.loads(text) == {
        "type": "progress", "id": "d", "progress": 0.0, "message": "m", "stage": stage}
    assert decode_frame(text) == Progress("d", 0.0, message="m", stage=stage)


def test_a_plain_progress_report_has_no_stage_on_the_wire():
    assert "stage" not in json.loads(encode_frame(Progress("d", 1.0)))
    assert decode_frame('{"type":"progress","id":"d","progress":1}').stage is None


@pytest.mark.parametrize(
    ("stage", "reason"),
    [
        ("delivered", "stage: not one of ['awaiting_approval', 'running']"),
        ("", "stage: must not be empty"),
        ("s" * 33, "stage: longer than 32 characters"),
        (1, "stage: expected string, got number"),
    ],
)
def test_a_stage_outside_the_set_is_refused_by_name(stage, reason):
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(json.dumps({"type": "progress", "id": "d", "progress": 0, "stage": stage}))
    assert (info.value.reason, info.value.close_code) == (reason, CLOSE_INVALID_PAYLOAD)
    with pytest.raises(LocalProtocolError):
        encode_frame(Progress("d", 0.0, stage=stage))


def _job(**over) -> Job:
    return Job("d", "j", "echo", {}, "k", 1.0, **over)


def test_a_jobs_waited_s_round_trips_and_is_left_out_when_unknown():
    assert decode_frame(encode_frame(_job(waited_s=0.0))).waited_s == 0.0
    assert decode_frame(encode_frame(_job(waited_s=61.5))).waited_s == 61.5
    assert "waited_s" not in json.loads(encode_frame(_job()))
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(encode_frame(_job()).replace('"deadline"', '"waited_s":-1,"deadline"'))
    assert info.value.reason == "waited_s: must not be negative"


def test_a_catalogue_entry_carries_its_approval_declaration_only_when_it_has_one():
    hello = Hello(1, "x", (ToolSpec("plain"), ToolSpec("pay", approval_after_wait_s=0.0),
                           ToolSpec("form", approval_after_wait_s=60.0)))  # fmt: skip
    tools = json.loads(encode_frame(hello))["tools"]
    assert [t.get("approval_after_wait_s", "absent") for t in tools] == ["absent", 0.0, 60.0]
    assert decode_frame(encode_frame(hello)) == hello
    bad = {"type": "hello", "protocol_version": 1, "sidecar_version": "x",
           "tools": [{"name": "t", "approval_after_wait_s": -1}]}  # fmt: skip
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(json.dumps(bad))
    assert info.value.reason == "tools[0].approval_after_wait_s: must not be negative"
