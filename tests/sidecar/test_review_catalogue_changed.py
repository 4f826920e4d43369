"""Review: the per-tool fingerprints that make ``catalogue_changed`` were swapped at every
daemon start, before the hub had heard of the new catalogue. They are now recorded when
the hub welcomes a hello (``_catalogue.acknowledge``), and compared with that record."""

from __future__ import annotations

from deskbridge_sidecar import ToolRegistry
from deskbridge_sidecar._catalogue import acknowledge, catalogue_at_start
from deskbridge_sidecar._ledger import Ledger
from deskbridge_sidecar.toolsets.files import FilesToolset


async def test_a_change_is_still_reported_after_a_start_that_was_never_welcomed(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    path = tmp_path / "ledger.sqlite3"

    async def start(root: str, *, welcomed: bool = False) -> frozenset[str]:
        ledger = Ledger.open(path)
        try:
            found = await catalogue_at_start(
                ledger, ToolRegistry(FilesToolset([tmp_path / root]).tools())
            )
            if welcomed:
                await acknowledge(ledger, found.fingerprints, at=1_700_000_000.0)
            return found.changed
        finally:
            ledger.close()

    # run 1, welcomed: the hub has root a's catalogue
    assert await start("a", welcomed=True) == frozenset()
    assert "files_write" in await start("b")  # run 2: changed; stopped before its welcome
    # run 3, same configuration as run 2: the hub still validated the queued jobs
    # against run 1's catalogue (it never heard run 2's), so the change still holds
    assert "files_write" in await start("b")
