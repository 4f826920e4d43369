"""``deskbridge-hub inspect`` in text mode prints what sidecars sent (``hello.
sidecar_version``: any string of 64 characters) and what callers chose (job ids): a
terminal escape in it reached the operator's terminal as is (``ESC ] 52`` sets the
clipboard in many terminals, ``ESC [ 2 J`` clears the screen, a newline forges a line)."""

from __future__ import annotations

from deskbridge_hub._inspect_cli import desktops_table, user_text

HOSTILE = "1.0\x1b]52;c;cHduZWQ=\x07\x1b[2J\nstate       online"


def _desktop(**extra):
    return {
        "user_id": "alice",
        "online": True,
        "since": 1.0,
        "sidecar_version": HOSTILE,
        "tools": ["echo"],
        "queue": {"length": 1, "pending_count": 1, "pending": []},
        **extra,
    }


def _clean(text: str, lines: int) -> None:
    assert not any(c in text for c in "\x1b\x07\r"), repr(text)
    assert len(text.split("\n")) == lines, text


def test_a_desktops_table_shows_control_characters_escaped():
    body = {"desktops": [_desktop()], "offset": 0, "total": 1, "next_offset": None}
    _clean(desktops_table(body), 3)  # header, one row, the footer


def test_a_user_page_shows_control_characters_escaped():
    def body(version: str, reason: str, consumer: str) -> dict:
        pending = [
            {"entry_id": "1-0", "job_id": "j", "consumer": consumer, "idle_ms": 1, "deliveries": 1}
        ]
        return _desktop(
            sidecar_version=version,
            session_id="s",
            hub_consumer="h",
            end={"code": 1000, "reason": reason},
            queue={"length": 1, "pending_count": 1, "pending": pending},
        )

    plain = user_text(body("1.0", "bye", "c"))
    _clean(user_text(body(HOSTILE, "x\x1b[2J", "c\x1b[31m")), len(plain.split("\n")))


def test_a_user_no_sidecar_ever_connected_as_is_said_to_be_never_seen():
    # a newcomer pass: ``inspect user alcie`` (a typo) printed "state offline since - UTC",
    # as if alcie's desktop had existed and gone; the admin API's record is all nulls
    never = {
        "user_id": "alcie", "online": False, "since": None, "session_id": None,
        "sidecar_version": None, "tools": None, "connected_at": None, "ended_at": None,
        "end": None, "hub_consumer": None, "catalogue": None,
        "queue": {"length": 0, "pending_count": 0, "pending": []}, "in_flight": [],
    }  # fmt: skip
    state = user_text(never).split("\n")[1]
    assert state.startswith("state       never seen: no sidecar of 'alcie' connected"), state
    assert "- UTC" not in state
    # seen, but when is not known (its hub was killed): no "since - UTC" either
    state = user_text({**never, "connected_at": 5.0, "session_id": "s"}).split("\n")[1]
    assert state == "state       offline (since when is not known)", state
    state = user_text({**never, "since": 0.0, "ended_at": 0.0}).split("\n")[1]
    assert state == "state       offline since 1970-01-01 00:00:00 UTC", state


def test_a_job_page_shows_its_time_in_utc_not_as_a_unix_number():
    # a newcomer pass: ``inspect job J`` printed "at 1796442411.614957" while ``desktops``
    # and ``user`` print UTC times
    from deskbridge_hub._inspect_cli import job_text

    body = {"job_id": "j", "stage": "delivered", "user_id": "alice", "at": 1796442411.6}
    rows = dict(line.split(None, 1) for line in job_text(body).split("\n")[1:])
    assert rows["at"] == "2026-12-05 03:46:51 UTC"
    assert rows["stage"] == "delivered"
