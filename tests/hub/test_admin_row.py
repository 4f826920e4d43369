"""``desktop_row`` (no I/O): what the admin API says of one desktop from its presence and
its directory record, when the two name different sessions."""

from __future__ import annotations

from deskbridge_hub._admin import desktop_row

RECORD = {
    "session_id": "old",
    "sidecar_version": "0.1.0",
    "consumer": "stopped-hub",
    "connected_at": 1_800_000_000.0,
    "ended_at": 1_800_000_041.0,
    "end": {"code": 4002, "reason": "nothing from the sidecar"},
}


def test_an_online_row_names_no_hub_from_another_sessions_record() -> None:
    """Presence names the desktop's new session, the record is still the old one's
    (its start was not recorded: Redis refused it): the row must not name the old
    session's hub process as the holder, as it does not give its sidecar version."""
    row = desktop_row("alice", 1_800_000_041.0, "new", RECORD, None)
    assert row["online"] is True and row["session_id"] == "new"
    assert row["hub_consumer"] is None
    assert row["sidecar_version"] is None and row["since"] is None


def test_the_same_sessions_record_names_its_hub() -> None:
    record = {**RECORD, "session_id": "new"}
    del record["ended_at"], record["end"]
    row = desktop_row("alice", 1_800_000_000.0, "new", record, None)
    assert row["hub_consumer"] == "stopped-hub" and row["since"] == 1_800_000_000.0
    offline = desktop_row("alice", 1_800_000_041.0, None, RECORD, None)
    assert offline["hub_consumer"] == "stopped-hub"  # the last session's, labelled so
