"""Cold cache for one attempt: drop a set of files' pages from the page cache.

A memory cgroup is charged for a page-cache page by the group that first faults
it in. A checkpoint page left in the cache by an earlier attempt (or by the
checkpoint's generation) is charged to someone else, so an attempt that finds
it there runs for free and its group's peak undercounts: every attempt of a
budget sweep starts with its files dropped from the cache.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["drop_page_cache"]


def drop_page_cache(paths: Iterable[str | os.PathLike[str]]) -> None:
    """Write back, then drop, every page of each file from the page cache (no root needed).

    ``posix_fadvise(POSIX_FADV_DONTNEED)`` leaves dirty pages in place, so each file is
    ``fsync``-ed first: a checkpoint written just before the sweep would otherwise stay
    partly cached (and charged to whoever wrote it). A missing file raises
    ``FileNotFoundError`` naming it.
    """
    for path in paths:
        fd = os.open(Path(path), os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
