"""Saying what a path that is not a regular file is, for errors ("a named pipe (FIFO)", ...)."""

from __future__ import annotations

import stat

__all__ = ["non_regular_kind"]

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def non_regular_kind(mode: int) -> str | None:
    """What a file of ``st_mode`` ``mode`` is when it is not a regular file ("a directory", ...); None if it is."""
    if stat.S_ISREG(mode):
        return None
    for test, name in _KINDS:
        if test(mode):
            return name
    return f"not a regular file (mode {stat.filemode(mode)})"
