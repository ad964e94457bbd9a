"""Paths in records: written relative to the repository root where inside it, read back resolved against it.

The repository root is the current working directory (the harness runs from a checkout,
:mod:`harness.scenario`), where a scenario's paths are given from: ``data/pi05.safetensors``,
``harness/specs/pi05.json``. A record keeps them in that form, so that it names no folder of the
machine that made it and reads the same in another checkout; a path outside the root (a checkpoint on
another disk) is kept as it was given, absolute. Reading resolves a relative path against the root of
the process that reads, and leaves an absolute one (every record written before paths were kept
relative) as it is.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["record_path", "resolved_path", "root"]


def root() -> Path:
    """The repository root the paths of a record are relative to: the current working directory."""
    return Path.cwd()


def record_path(path: str | os.PathLike[str]) -> str:
    """``path`` as a record holds it: relative to :func:`root` where it lies inside it (compared as written, so
    that a path given as ``<root>/data/x`` is ``data/x`` whatever links lie under the root), else unchanged."""
    given = Path(path)
    if not given.is_absolute():
        return str(given)
    try:
        return str(given.relative_to(root()))
    except ValueError:
        return str(given)


def resolved_path(text: str) -> str:
    """A path a record holds, as the reader uses it: a relative one joined to :func:`root`, an absolute one as it is."""
    given = Path(text)
    return str(given if given.is_absolute() else root() / given)
