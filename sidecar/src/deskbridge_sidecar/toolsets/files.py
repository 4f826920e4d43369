"""The *files* toolset: list a folder, read a text file, write a file — confined to
configured roots.

Opt-in: nothing is offered unless the user names at least one root
(``deskbridge-sidecar run --files-root ~/Documents/invoices``). Every path is resolved
(``os.path.realpath``: ``..`` and every symlink followed) before it is used, and must land
inside a root (also resolved), so ``../../etc/passwd`` and a symlink inside a root that
points out of it are refused alike (``outside_roots``). A file is opened with
``O_NOFOLLOW`` on its resolved path, so a symlink swapped in after the check is refused
too. Reads and writes are bounded (``too_large``); writes are atomic (a temporary file in
the same folder, then ``os.replace``) and never replace a symlink.

Paths given to the tools may be absolute, or relative to the first root.

Error codes (``ToolError.code``): ``bad_path`` (a NUL character: no file system takes
it), ``outside_roots``, ``not_found``, ``not_a_directory``, ``is_a_directory``,
``too_large``, ``not_text``, ``exists``, ``io_error``.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import attrs
import pydantic
from deskbridge_common import MAX_FRAME_BYTES

from .._tools import Tool, ToolError
from . import _fdwalk

#: Largest file ``files_read`` returns, bytes (1 MiB: it must fit in a result frame).
MAX_READ_BYTES = 1024 * 1024
#: The most a file's text may take as JSON (escapes included) in a ``files_read`` answer:
#: one frame (``MAX_FRAME_BYTES``, 1 MiB) less room for the rest of the answer.
_TEXT_ROOM = MAX_FRAME_BYTES - 16 * 1024
#: Largest content ``files_write`` writes, bytes.
MAX_WRITE_BYTES = 1024 * 1024
#: Most entries ``files_list`` returns.
MAX_LIST_ENTRIES = 1000


@attrs.define(eq=False)
class FilesToolset:
    """The files tools, bound to their roots.

    Args:
        roots: folders the tools may touch (resolved once, at construction).
        max_read_bytes: largest file returned by ``files_read``.
        max_write_bytes: largest content accepted by ``files_write``.

    Raises:
        ValueError: no roots, or a root that is not an existing folder.
    """

    roots: Sequence[str | os.PathLike[str]] = attrs.field(converter=tuple)
    max_read_bytes: int = MAX_READ_BYTES
    max_write_bytes: int = MAX_WRITE_BYTES
    _resolved: tuple[Path, ...] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        if not self.roots:
            raise ValueError("the files toolset needs at least one root folder")
        if not _fdwalk.supported():  # without openat, a checked path cannot be walked safely
            raise ValueError("the files toolset needs O_NOFOLLOW and dir_fd (POSIX) support")
        resolved = []
        for root in self.roots:
            path = Path(os.path.realpath(os.path.expanduser(root)))
            if not path.is_dir():
                raise ValueError(f"files root {str(root)!r} is not an existing folder")
            resolved.append(path)
        self._resolved = tuple(resolved)

    def tools(self) -> list[Tool]:
        """The toolset's tools, for :meth:`ToolRegistry.add`."""
        # a call's paths mean something else elsewhere; its size limits refuse other calls
        config = json.dumps(
            [[str(r) for r in self._resolved], self.max_read_bytes, self.max_write_bytes]
        )
        return [
            attrs.evolve(t, config=config)
            for t in (
                Tool.from_function(self.files_list, name="files_list"),
                Tool.from_function(self.files_read, name="files_read"),
                Tool.from_function(self.files_write, name="files_write", side_effects=True),
            )
        ]

    # -- confinement -------------------------------------------------------------------

    def resolve(self, path: str) -> Path:
        """The real path of ``path`` (absolute, or relative to the first root).

        Raises:
            ToolError: ``bad_path`` if it holds a NUL character; ``outside_roots`` if it
                resolves outside every root.
        """
        if "\x00" in path:  # os.path.realpath raises ValueError: was a "crashed" job
            raise ToolError(f"{path!r} contains a NUL character", code="bad_path")
        given = Path(os.path.expanduser(path))
        candidate = given if given.is_absolute() else self._resolved[0] / given
        real = Path(os.path.realpath(candidate))
        if not any(real == root or real.is_relative_to(root) for root in self._resolved):
            raise ToolError(
                f"{path!r} resolves to {str(real)!r}, outside the allowed roots "
                f"{[str(r) for r in self._resolved]}",
                code="outside_roots",
            )
        return real

    def _root_of(self, real: Path) -> Path:
        """The innermost root holding the resolved path ``real``."""
        return max(
            (r for r in self._resolved if real == r or real.is_relative_to(r)),
            key=lambda r: len(r.parts),
        )

    @contextmanager
    def _folder(self, path: str, real: Path, *, create: bool = False) -> Iterator[int]:
        """A descriptor of the checked folder ``real``, walked from its root without
        following symlinks (:mod:`._fdwalk`): a folder on the way swapped for a symlink
        after the check is ``outside_roots``, never followed."""
        try:
            with _fdwalk.open_folder(self._root_of(real), real, create=create) as fd:
                yield fd
        except _fdwalk.Swapped:
            raise _changed(path) from None

    # -- tools -------------------------------------------------------------------------

    def files_list(self, path: str | None = None) -> dict[str, Any]:
        """List a folder inside the allowed roots (or the roots themselves).

        Args:
            path: the folder, absolute or relative to the first root; omit it to list the
                roots.
        """
        if path is None:
            return {"path": None, "entries": [_entry(r, str(r)) for r in self._resolved]}
        folder = self.resolve(path)
        if not folder.exists():
            raise ToolError(f"{path!r} does not exist", code="not_found")
        if not folder.is_dir():
            raise ToolError(f"{path!r} is not a folder", code="not_a_directory")
        entries: list[dict[str, Any]] = []
        truncated = False
        try:
            with self._folder(path, folder) as fd, os.scandir(fd) as found:
                for item in sorted(found, key=lambda e: e.name):
                    if len(entries) >= MAX_LIST_ENTRIES:
                        truncated = True
                        break
                    entries.append(_dir_entry(item))
        except FileNotFoundError:
            raise ToolError(f"{path!r} does not exist", code="not_found") from None
        except OSError as exc:
            raise ToolError(f"cannot list {path!r}: {exc.strerror}", code="io_error") from None
        return {"path": str(folder), "entries": entries, "truncated": truncated}

    def files_read(self, path: str) -> dict[str, Any]:
        """Read a UTF-8 text file inside the allowed roots.

        Args:
            path: the file, absolute or relative to the first root.
        """
        real = self.resolve(path)
        if real == self._root_of(real):
            raise ToolError(f"{path!r} is a folder", code="is_a_directory")
        try:
            with self._folder(path, real.parent) as folder_fd:
                fd, info = _fdwalk.open_regular(folder_fd, real.name)
        except FileNotFoundError:
            raise ToolError(f"{path!r} does not exist", code="not_found") from None
        except IsADirectoryError:
            raise ToolError(f"{path!r} is a folder", code="is_a_directory") from None
        except _fdwalk.Swapped:
            raise _changed(path) from None
        except _fdwalk.NotRegular as kind:
            raise ToolError(
                f"{path!r} is a {kind}, not a regular file; files_read reads files only",
                code="not_a_file",
            ) from None
        except OSError as exc:
            raise ToolError(f"cannot open {path!r}: {exc.strerror}", code="io_error") from None
        with os.fdopen(fd, "rb") as handle:
            if info.st_size > self.max_read_bytes:
                raise ToolError(
                    f"{path!r} is {info.st_size} bytes; files_read returns at most "
                    f"{self.max_read_bytes}",
                    code="too_large",
                )
            data = handle.read(self.max_read_bytes + 1)
        if len(data) > self.max_read_bytes:  # grew since fstat
            raise ToolError(
                f"{path!r} is larger than {self.max_read_bytes} bytes", code="too_large"
            )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ToolError(
                f"{path!r} is not UTF-8 text (byte {exc.start})", code="not_text"
            ) from None
        encoded = len(json.dumps(text))  # as the answer's frame carries it: escapes count
        if encoded > _TEXT_ROOM:
            raise ToolError(
                f"{path!r} is {len(data)} bytes, {encoded} as JSON text (escapes count): more "
                f"than one answer carries ({_TEXT_ROOM})",
                code="too_large",
            )
        return {"path": str(real), "text": text, "bytes": len(data)}

    def files_write(
        self,
        path: str,
        content: str,
        overwrite: Annotated[
            bool, pydantic.Field(description="replace an existing file (default: refuse)")
        ] = False,
        create_folders: Annotated[
            bool, pydantic.Field(description="create missing parent folders inside the root")
        ] = False,
    ) -> dict[str, Any]:
        """Write a UTF-8 text file inside the allowed roots (atomically).

        Args:
            path: the file, absolute or relative to the first root.
            content: the text to write.
        """
        data = content.encode("utf-8")
        if len(data) > self.max_write_bytes:
            raise ToolError(
                f"content is {len(data)} bytes; files_write accepts at most {self.max_write_bytes}",
                code="too_large",
            )
        given = Path(os.path.expanduser(path))
        target = given if given.is_absolute() else self._resolved[0] / given
        parent = self.resolve(str(target.parent))
        final = parent / target.name
        if target.name in ("", ".", ".."):
            raise ToolError(f"{path!r} does not name a file", code="is_a_directory")
        self.resolve(str(final))  # a symlink at the final component pointing out
        if not parent.exists() and not create_folders:
            raise ToolError(
                f"folder {str(parent)!r} does not exist (pass create_folders: true)",
                code="not_found",
            )
        try:
            with self._folder(path, parent, create=create_folders) as folder_fd:
                _write_in(folder_fd, final.name, data, path=path, overwrite=overwrite)
        except FileNotFoundError:
            raise ToolError(
                f"folder {str(parent)!r} does not exist (pass create_folders: true)",
                code="not_found",
            ) from None
        except OSError as exc:
            raise ToolError(f"cannot write {path!r}: {exc.strerror}", code="io_error") from None
        return {"path": str(final), "bytes": len(data)}


def _changed(path: str) -> ToolError:
    return ToolError(
        f"{path!r} changed while in use: a folder on its way is now a symlink, which may "
        f"lead outside the allowed roots",
        code="outside_roots",
    )


def _write_in(folder_fd: int, name: str, data: bytes, *, path: str, overwrite: bool) -> None:
    """Write ``name`` in the folder atomically: a temporary file there, then a rename; a
    replaced file keeps its mode, a new one is 0600. Never replaces a symlink or a folder."""
    existing = _fdwalk.lstat_in(folder_fd, name)
    if existing is not None:
        if stat.S_ISLNK(existing.st_mode):
            raise ToolError(f"{path!r} is a symlink; not replaced", code="outside_roots")
        if stat.S_ISDIR(existing.st_mode):
            raise ToolError(f"{path!r} is a folder", code="is_a_directory")
        if not overwrite:
            raise ToolError(f"{path!r} exists (pass overwrite: true to replace it)", code="exists")
    mode = stat.S_IMODE(existing.st_mode) if existing is not None else 0o600
    tmp = f".deskbridge-{secrets.token_hex(8)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags, 0o600, dir_fd=folder_fd)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            os.fchmod(handle.fileno(), mode)
        os.replace(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=folder_fd)
        except OSError:
            pass
        raise


def _dir_entry(item: os.DirEntry[str]) -> dict[str, Any]:
    try:
        info = item.stat(follow_symlinks=False)
    except OSError:
        return {**_named(item.name), "type": "unknown"}
    return _described(item.name, info)


def _entry(path: Path, name: str) -> dict[str, Any]:
    try:
        info = path.lstat()
    except OSError:
        return {**_named(name), "type": "unknown"}
    return _described(name, info)


def _described(name: str, info: os.stat_result) -> dict[str, Any]:
    kind = _fdwalk.kind_of(info.st_mode)
    kind = kind if kind in ("file", "folder", "symlink") else "other"
    return {**_named(name), "type": kind, "bytes": info.st_size, "modified": info.st_mtime}


def _named(name: str) -> dict[str, Any]:
    """``{"name": name}``; a name that is not UTF-8 (Linux allows any bytes; Python
    gives lone surrogates, which no answer may carry) has its odd bytes written
    ``\\xNN`` and says so (``name_not_utf8``): listed, though not a path to pass back."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        escaped = os.fsencode(name).decode("utf-8", "backslashreplace")
        return {"name": escaped, "name_not_utf8": True}
    return {"name": name}


__all__ = ["FilesToolset"]
