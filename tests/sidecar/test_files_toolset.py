"""The files toolset: confined to its roots (traversal, symlinks out, oversize refused)."""

from __future__ import annotations

import os

import pytest
from deskbridge_sidecar import ToolRegistry, invoke
from deskbridge_sidecar.toolsets import FilesToolset


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "root"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "a.txt").write_text("hello\n")
    (root / "bin.dat").write_bytes(b"\xff\xfe\x00")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    (root / "link_out").symlink_to(outside / "secret.txt")
    (root / "dir_out").symlink_to(outside)
    (root / "link_in").symlink_to(root / "docs" / "a.txt")
    return root, outside


def registry(root, **kwargs) -> ToolRegistry:
    return ToolRegistry(FilesToolset([root], **kwargs).tools(), builtins=False)


async def call(reg: ToolRegistry, name: str, **args):
    return await invoke(reg.get(name), args)


async def test_list_read_write_inside_the_root(tree):
    root, _ = tree
    reg = registry(root)
    assert reg.get("files_write").side_effects and not reg.get("files_read").side_effects
    listed = (await call(reg, "files_list", path="docs")).result
    assert [e["name"] for e in listed["entries"]] == ["a.txt"]
    assert listed["entries"][0]["type"] == "file" and listed["entries"][0]["bytes"] == 6
    roots = (await call(reg, "files_list")).result
    assert roots["entries"][0]["name"] == str(root.resolve())
    top = {
        e["name"]: e["type"]
        for e in (await call(reg, "files_list", path=str(root))).result["entries"]
    }
    assert top["link_out"] == "symlink" and top["docs"] == "folder"

    read = (await call(reg, "files_read", path=str(root / "docs" / "a.txt"))).result
    assert read["text"] == "hello\n" and read["bytes"] == 6
    assert (await call(reg, "files_read", path="link_in")).result["text"] == "hello\n"

    wrote = await call(reg, "files_write", path="docs/new.txt", content="é\n")
    assert wrote.ok and wrote.result["bytes"] == 3
    assert (root / "docs" / "new.txt").read_text() == "é\n"
    again = await call(reg, "files_write", path="docs/new.txt", content="x")
    assert again.code == "exists"
    assert (await call(reg, "files_write", path="docs/new.txt", content="x", overwrite=True)).ok
    assert (root / "docs" / "new.txt").read_text() == "x"
    nested = await call(reg, "files_write", path="deep/er/f.txt", content="1")
    assert nested.code == "not_found"
    assert (
        await call(reg, "files_write", path="deep/er/f.txt", content="1", create_folders=True)
    ).ok
    assert not [p for p in (root / "docs").iterdir() if p.name.startswith(".deskbridge-")]


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("files_read", {"path": "../outside/secret.txt"}),
        ("files_read", {"path": "docs/../../outside/secret.txt"}),
        ("files_read", {"path": "link_out"}),
        ("files_read", {"path": "dir_out/secret.txt"}),
        ("files_list", {"path": "dir_out"}),
        ("files_list", {"path": "/"}),
        ("files_write", {"path": "../outside/new.txt", "content": "x"}),
        ("files_write", {"path": "dir_out/new.txt", "content": "x"}),
        ("files_write", {"path": "link_out", "content": "x", "overwrite": True}),
    ],
)
async def test_paths_out_of_the_root_are_refused(tree, tool, args):
    root, outside = tree
    before = sorted(os.listdir(outside))
    outcome = await call(registry(root), tool, **args)
    assert outcome.code == "outside_roots", outcome
    assert "outside the allowed roots" in outcome.error.message
    assert sorted(os.listdir(outside)) == before
    assert (outside / "secret.txt").read_text() == "secret"


async def test_oversize_binary_missing_and_wrong_kind(tree):
    root, _ = tree
    reg = registry(root, max_read_bytes=4, max_write_bytes=4)
    big = await call(reg, "files_read", path="docs/a.txt")
    assert big.code == "too_large" and "6 bytes" in big.error.message
    assert (await call(reg, "files_write", path="x.txt", content="12345")).code == "too_large"
    assert not (root / "x.txt").exists()
    assert (await call(reg, "files_read", path="bin.dat")).code == "not_text"
    assert (await call(reg, "files_read", path="nope.txt")).code == "not_found"
    assert (await call(reg, "files_read", path="docs")).code == "is_a_directory"
    assert (await call(reg, "files_list", path="docs/a.txt")).code == "not_a_directory"
    assert (await call(reg, "files_write", path="docs", content="x")).code == "is_a_directory"
    assert (await call(reg, "files_read", path=5)).code == "bad_args"


@pytest.mark.parametrize("tool", ["files_read", "files_list", "files_write"])
async def test_a_nul_in_a_path_is_bad_path_not_a_crash(tree, tool):
    root, _ = tree
    args = {"path": "docs/a.txt\x00x"}
    if tool == "files_write":
        args["content"] = "x"
    outcome = await call(registry(root), tool, **args)
    assert outcome.code == "bad_path", outcome  # was crashed: ValueError('embedded null byte')


async def test_a_file_whose_json_text_overflows_a_frame_is_too_large(tree):
    """Under 1 MiB on disk, but 900 KB of quotes are 1.8 MB as JSON text: the answer could
    not be sent (``bad_result``); it is ``too_large``, saying why."""
    root, _ = tree
    (root / "quotes.txt").write_text('"' * 900_000)
    (root / "plain.txt").write_text("a" * 900_000)
    quoted = await call(registry(root), "files_read", path="quotes.txt")
    assert quoted.code == "too_large" and "as JSON text" in quoted.error.message
    plain = await call(registry(root), "files_read", path="plain.txt")
    assert plain.ok and plain.result["bytes"] == 900_000


async def test_overwriting_keeps_the_mode_and_a_new_file_is_private(tree):
    root, _ = tree
    (root / "docs" / "a.txt").chmod(0o644)
    reg = registry(root)
    done = await call(reg, "files_write", path="docs/a.txt", content="new", overwrite=True)
    assert done.ok and (root / "docs" / "a.txt").read_text() == "new"
    assert (root / "docs" / "a.txt").stat().st_mode & 0o777 == 0o644  # was made 0600
    assert (await call(reg, "files_write", path="b.txt", content="x")).ok
    assert (root / "b.txt").stat().st_mode & 0o777 == 0o600


def test_roots_must_exist(tmp_path):
    with pytest.raises(ValueError, match="at least one root"):
        FilesToolset([])
    with pytest.raises(ValueError, match="not an existing folder"):
        FilesToolset([tmp_path / "missing"])


# -- special files and races (security review) ------------------------------------------


@pytest.fixture
def fifo_writer():
    """Unblocks a reader stuck opening a FIFO, at most 5 s later (only the old code waits)."""
    import threading

    done = threading.Event()
    paths: list[str] = []

    def unblock() -> None:
        done.wait(5)
        for p in paths:
            try:
                os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass  # no reader left: the tool did not block

    thread = threading.Thread(target=unblock, daemon=True)
    thread.start()
    yield paths
    done.set()
    thread.join(10)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
async def test_a_fifo_is_refused_not_a_read_that_hangs(tree, fifo_writer):
    """Opening a FIFO for reading blocks until a writer comes: the job's worker thread hung
    (and, holding its slot, the sidecar's work) until then. Special files are refused."""
    import time

    root, _ = tree
    os.mkfifo(root / "pipe")
    fifo_writer.append(str(root / "pipe"))
    started = time.monotonic()
    outcome = await call(registry(root), "files_read", path="pipe")
    assert time.monotonic() - started < 2, "files_read blocked on a FIFO"
    assert outcome.code == "not_a_file", outcome


def _swap_after_resolve(monkeypatch, toolset, victim, target, last_check):
    """After the toolset's path check of ``last_check`` (a path's last part), replace the
    folder ``victim`` by a symlink to ``target``: the check-then-use race a local process
    can win. Returns a list that holds True once the swap happened."""
    original = type(toolset).resolve
    swapped: list[bool] = []

    def resolve(self, path):
        real = original(self, path)
        if not swapped and os.path.basename(path) == last_check:
            swapped.append(True)
            victim.rename(victim.with_name(victim.name + ".moved"))
            victim.symlink_to(target, target_is_directory=True)
        return real

    monkeypatch.setattr(type(toolset), "resolve", resolve)
    return swapped


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("files_read", {"path": "docs/a.txt"}),
        ("files_list", {"path": "docs"}),
        ("files_write", {"path": "docs/a.txt", "content": "pwned", "overwrite": True}),
        ("files_write", {"path": "docs/new.txt", "content": "pwned"}),
    ],
)
async def test_a_folder_swapped_for_a_symlink_after_the_check_is_refused(
    tree, monkeypatch, tool, args
):
    """TOCTOU: ``O_NOFOLLOW`` guards only the last component; a folder on the way swapped
    for a symlink out of the root between the check and the open was followed."""
    root, outside = tree
    (outside / "a.txt").write_text("secret")
    toolset = FilesToolset([root])
    last = os.path.basename(args["path"])
    swapped = _swap_after_resolve(monkeypatch, toolset, root / "docs", outside, last)
    reg = ToolRegistry(toolset.tools(), builtins=False)
    before = sorted(os.listdir(outside))
    outcome = await call(reg, tool, **args)
    assert swapped, "the race was not staged"
    assert outcome.code == "outside_roots", outcome
    assert sorted(os.listdir(outside)) == before
    assert (outside / "a.txt").read_text() == "secret"


async def test_a_root_swapped_for_a_symlink_after_start_is_refused(tree):
    root, outside = tree
    (outside / "a.txt").write_text("secret")
    reg = registry(root)
    root.rename(root.with_name("root.moved"))
    root.symlink_to(outside, target_is_directory=True)
    outcome = await call(reg, "files_read", path=str(root / "a.txt"))
    assert outcome.code == "outside_roots", outcome
