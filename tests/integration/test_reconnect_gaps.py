"""Issue 16 item 1 on real processes: a sidecar whose healthy session drops is back
within a second, every time, not after a backoff that grew while it was healthy.

One hub, one sidecar dialling through a cutting proxy; each connection is cut 8 s after
it connects (default timings: no ping in 8 s). The field saw gaps of 0.4, 0.7, 0.4, 6.9,
5.3, ... 29.9 s: the backoff reset only after a 30 s session. The bench with the same
code prints p50/p99 over more cycles: ``bench/reconnect_gaps.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from reconnect_gaps import cut_cycles  # noqa: E402

pytestmark = pytest.mark.integration

#: Four cycles: with the old ladder (windows 1, 2, 4, 8 s) the chance that every gap
#: still lands under the bound is about 5 %; with the reset it is certain but for
#: machine load (the first window is 0.5 s; connect + hello take tens of ms).
CYCLES = 4
BOUND_S = 1.5


def test_sessions_cut_8_s_after_connect_are_back_within_a_second(tmp_path):
    gaps = cut_cycles(tmp_path, cycles=CYCLES, hold_s=8.0)
    print("reconnect gaps (s):", [round(g, 3) for g in gaps])
    assert len(gaps) == CYCLES
    assert max(gaps) < BOUND_S, gaps
