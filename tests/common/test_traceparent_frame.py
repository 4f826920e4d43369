"""The ``job`` frame's optional ``traceparent``: carried when set, left out when not,
refused when it is not a bounded string."""

from __future__ import annotations

import json

import pytest
from deskbridge_common import Job, RemoteProtocolError, decode_frame, encode_frame

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def job(**kw) -> Job:
    return Job(id="d1", job_id="j1", name="echo", args={}, idempotency_key="k", deadline=1.0, **kw)


def test_round_trip_and_omission() -> None:
    assert decode_frame(encode_frame(job(traceparent=TP))) == job(traceparent=TP)
    assert "traceparent" not in json.loads(encode_frame(job()))
    assert decode_frame(encode_frame(job())).traceparent is None


@pytest.mark.parametrize("bad", [1, "", "x" * 257, None])
def test_bad_traceparent_names_the_field(bad) -> None:
    obj = json.loads(encode_frame(job()))
    obj["traceparent"] = bad
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(json.dumps(obj))
    assert info.value.field == "traceparent"
