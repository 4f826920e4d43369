"""Use a checked path without trusting it twice: walk it from its root one folder at a time
with ``O_NOFOLLOW`` (``openat``), so a folder swapped for a symlink after the check is
refused instead of followed. No module state; POSIX ``dir_fd`` support is required
(Linux, macOS, BSDs).

The files toolset resolves a path (``os.path.realpath``) and checks it lands under a root;
the resolved path holds no symlink, so meeting one on the walk means the tree changed since
the check (``Swapped``).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class Swapped(Exception):
    """A component of a checked path is now a symlink (or no longer a folder)."""


def supported() -> bool:
    """True when ``O_NOFOLLOW`` exists and ``open``, ``stat``, ``mkdir``, ``replace`` and
    ``unlink`` take ``dir_fd`` here (``os.replace`` shares ``os.rename``'s; not on Windows)."""
    return bool(_NOFOLLOW) and {os.open, os.stat, os.mkdir, os.rename, os.unlink} <= (
        os.supports_dir_fd
    )


@contextmanager
def open_folder(root: Path, real: Path, *, create: bool = False) -> Iterator[int]:
    """A file descriptor of the folder ``real`` (under ``root``, both resolved), opened by
    walking from ``root`` with ``O_NOFOLLOW``; closed on exit.

    Args:
        root: the resolved root the path was checked against.
        real: the resolved folder, ``root`` itself or below it.
        create: make missing folders on the way (mode 0777 less the umask).

    Raises:
        Swapped: a component is a symlink or not a folder.
        FileNotFoundError: a component is missing (and ``create`` is false).
        OSError: anything else the file system says.
    """
    fd = _open_dir(str(root), None)  # a root swapped for a symlink is refused too
    try:
        for part in real.relative_to(root).parts:
            if create:
                try:
                    os.mkdir(part, dir_fd=fd)
                except FileExistsError:
                    pass
            child = _open_dir(part, fd)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _open_dir(name: str, dir_fd: int | None) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            raise Swapped(name) from None
        raise


def lstat_in(folder_fd: int, name: str) -> os.stat_result | None:
    """``lstat`` of ``name`` in the folder, or None if it does not exist."""
    try:
        return os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def open_regular(folder_fd: int, name: str) -> tuple[int, os.stat_result]:
    """Open the regular file ``name`` in the folder for reading, never blocking on it.

    It is ``lstat``-ed first and opened only if it is a regular file, with ``O_NOFOLLOW``
    and ``O_NONBLOCK`` (a FIFO swapped in meanwhile cannot hang the open), then ``fstat``-ed
    to check it is still that file.

    Returns:
        The descriptor (blocking mode restored) and its ``fstat``.

    Raises:
        FileNotFoundError: no such entry.
        IsADirectoryError: it is a folder.
        Swapped: it is a symlink.
        NotRegular: a FIFO, socket, device... (message: its kind).
    """
    info = lstat_in(folder_fd, name)
    if info is None:
        raise FileNotFoundError(errno.ENOENT, "no such file", name)
    _check_kind(info, name)
    try:
        flags = os.O_RDONLY | _NOFOLLOW | _NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(name, flags, dir_fd=folder_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Swapped(name) from None
        raise
    try:
        opened = os.fstat(fd)
        _check_kind(opened, name)
        if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
            raise Swapped(name)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, opened


class NotRegular(Exception):
    """Not a regular file: its kind (``fifo``, ``socket``, ``device``...) is the message."""


def kind_of(mode: int) -> str:
    """``file``, ``folder``, ``symlink``, ``fifo``, ``socket``, ``device`` or ``other``."""
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "folder"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "other"


def _check_kind(info: os.stat_result, name: str) -> None:
    kind = kind_of(info.st_mode)
    if kind == "folder":
        raise IsADirectoryError(errno.EISDIR, "is a folder", name)
    if kind == "symlink":
        raise Swapped(name)
    if kind != "file":
        raise NotRegular(kind)


__all__ = [
    "NotRegular",
    "Swapped",
    "kind_of",
    "lstat_in",
    "open_folder",
    "open_regular",
    "supported",
]
