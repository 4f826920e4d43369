"""The daemon's ledger answers a job's redelivery as long as the hub keeps the job
(``forwarded_keep_s``: a day + the result TTL), for the result TTL the daemon runs with,
not only the default one."""

from __future__ import annotations

import trio
from deskbridge_common import Timings
from deskbridge_sidecar._ledger import job_keep_s

from .conftest import make_daemon


async def test_the_ledger_job_window_follows_the_daemons_result_ttl(
    autojump_clock, nursery, hub, wall, tmp_path
):
    timings = Timings(result_ttl_s=3600.0)
    for data_dir in (tmp_path, None):  # a file, and in memory
        daemon = make_daemon(hub, wall, timings=timings, data_dir=data_dir)
        await nursery.start(daemon.run)
        session = await hub.next_session()
        assert daemon._runner is not None
        assert daemon._runner.ledger.job_keep_s == job_keep_s(3600.0)
        daemon.stop()
        await session.wait_closed()
        await trio.sleep(1)
