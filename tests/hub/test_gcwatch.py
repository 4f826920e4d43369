"""The served hub's GC watch (``_gcwatch``, issue 10): a slow full collection is logged
(at most once a minute); young-generation collections and fast ones are not."""

from __future__ import annotations

import logging

import pytest
from deskbridge_hub import _gcwatch


def test_a_slow_full_collection_is_logged_once_a_minute(monkeypatch, caplog):
    import gc

    now = [1000.0]
    monkeypatch.setattr(_gcwatch.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(_gcwatch, "_warned_at", [-_gcwatch.WARN_EVERY_S])
    monkeypatch.setattr(_gcwatch, "_unfrozen_at", [now[0]])
    monkeypatch.setattr(gc, "freeze", lambda: None)  # the test process's heap stays as is

    def collection(generation: int, took_s: float) -> None:
        _gcwatch._on_gc("start", {"generation": generation})
        now[0] += took_s
        _gcwatch._on_gc("stop", {"generation": generation, "collected": 7})

    with caplog.at_level(logging.WARNING, logger="deskbridge.hub.gc"):
        collection(0, 2.0)  # young generation: never
        collection(2, 0.1)  # fast
        assert caplog.records == []
        collection(2, 0.8)
        assert len(caplog.records) == 1
        assert "0.80 s" in caplog.records[0].getMessage()
        collection(2, 0.8)  # within the minute: quiet
        now[0] += _gcwatch.WARN_EVERY_S
        collection(2, 0.9)
        assert len(caplog.records) == 2


@pytest.mark.parametrize("calls", [1, 2])
def test_install_freezes_and_hooks_once(monkeypatch, calls):
    import gc

    hooks: list[object] = []
    frozen: list[bool] = []
    monkeypatch.setattr(gc, "callbacks", hooks)
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(True))
    for _ in range(calls):
        _gcwatch.install()
    assert hooks == [_gcwatch._on_gc] and frozen == [True] * calls


def test_survivors_of_a_full_collection_are_frozen_and_given_back_hourly(monkeypatch):
    import gc

    now = [5000.0]
    calls: list[str] = []
    monkeypatch.setattr(_gcwatch.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(_gcwatch, "_unfrozen_at", [now[0]])
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))

    def full() -> None:
        _gcwatch._on_gc("start", {"generation": 2})
        _gcwatch._on_gc("stop", {"generation": 2, "collected": 0})

    _gcwatch._on_gc("start", {"generation": 1})
    _gcwatch._on_gc("stop", {"generation": 1, "collected": 0})
    assert calls == []  # only full collections
    full()
    assert calls == ["freeze"]
    now[0] += _gcwatch.UNFREEZE_EVERY_S
    full()
    assert calls == ["freeze", "unfreeze"]  # the hourly full walk
    full()
    assert calls == ["freeze", "unfreeze", "freeze"]
