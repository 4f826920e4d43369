"""The supervisor's rule for a worker that exits abnormally (``_supervisor.Restarts``):
replaced once it served, a stop when it never served or the workers crash in a loop."""

from __future__ import annotations

from deskbridge_hub._supervisor import RESTART_SPARE, STABLE_S, Restarts


def test_a_worker_killed_after_it_served_is_replaced_however_young() -> None:
    # a replacement (or a worker just after SIGHUP) killed 3 s after it started
    assert Restarts(2).replace(served=True, lived_s=3.0) is True


def test_a_worker_that_exits_before_it_served_stops_the_supervisor() -> None:
    assert Restarts(2).replace(served=False, lived_s=STABLE_S * 10) is False


def test_every_worker_killed_at_once_and_two_more_are_replaced_then_it_is_a_loop() -> None:
    restarts = Restarts(4)
    answers = [restarts.replace(served=True, lived_s=1.0) for _ in range(4 + RESTART_SPARE + 1)]
    assert answers == [True] * (4 + RESTART_SPARE) + [False]


def test_a_slow_crash_loop_is_still_a_loop() -> None:
    """One worker crashing every 16 s (or 11 s with 8 workers): no time window lets it
    run forever; short lives in a row count."""
    restarts = Restarts(8)
    answers = [restarts.replace(served=True, lived_s=11.0) for _ in range(8 + RESTART_SPARE + 1)]
    assert answers[-1] is False and all(answers[:-1])


def test_a_worker_that_ran_long_ends_the_count() -> None:
    restarts = Restarts(1)
    for _ in range(10):
        for _ in range(1 + RESTART_SPARE):
            assert restarts.replace(served=True, lived_s=1.0)
        assert restarts.replace(served=True, lived_s=STABLE_S)  # then one that had run 60 s
