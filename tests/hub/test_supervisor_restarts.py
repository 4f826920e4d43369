"""The supervisor's rule for a worker that exits abnormally (``_supervisor.Restarts``):
replaced when it had run, a stop when it never started or the workers crash in a loop."""

from __future__ import annotations

from deskbridge_hub._supervisor import RESTART_SPARE, RESTART_WINDOW_S, START_S, Restarts


def test_a_worker_killed_after_it_started_is_replaced() -> None:
    assert Restarts(2).replace(now_s=100.0, lived_s=START_S) is True


def test_a_worker_that_dies_during_its_start_stops_the_supervisor() -> None:
    assert Restarts(2).replace(now_s=100.0, lived_s=START_S - 0.1) is False


def test_every_worker_killed_at_once_and_two_more_are_replaced_then_it_is_a_loop() -> None:
    restarts = Restarts(4)
    answers = [
        restarts.replace(now_s=100.0 + n, lived_s=60.0) for n in range(4 + RESTART_SPARE + 1)
    ]
    assert answers == [True] * (4 + RESTART_SPARE) + [False]


def test_exits_older_than_the_window_are_forgotten() -> None:
    restarts = Restarts(1)
    t = 0.0
    for _ in range(10 * (1 + RESTART_SPARE)):  # one exit per window third, forever
        t += RESTART_WINDOW_S / 3 + 0.1
        assert restarts.replace(now_s=t, lived_s=START_S + 1)
