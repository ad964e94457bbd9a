"""How a finished run's directory gets to ``results/<name>/``: staged beside it, then put in place at once.

A run (or a budget sweep) writes into ``results/.<name>.partial/``, made by
:func:`check_results_root` before anything runs, and :func:`publish` replaces
``results/<name>/`` with it only once everything is written: an interrupted run or a full
disk leaves the earlier results as they were. ``results/<name>`` that is a link or a file is
refused, before the run and again at publishing; leftovers at ``.<name>.partial`` and
``.<name>.old`` are removed without following links.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from harness.errors import HarnessError, OutputError
from harness.results.atomic import write_atomic
from harness.results.record import NAME

__all__ = ["check_results_root", "publish"]


def _remove(path: Path) -> None:
    """Remove what is at ``path`` without following a link: a link or file is unlinked, a directory removed."""
    if path.is_symlink() or (os.path.lexists(path) and not path.is_dir()):
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def _check_replaceable(out: Path) -> None:
    """Refuse an ``out`` that a run could not replace as a whole: a link (it would be followed or
    replaced by a directory) or something other than a directory."""
    if out.is_symlink():
        raise OutputError(f"{out}: a symbolic link (to {os.readlink(out)}); the results are replaced as a whole "
                          f"and never through a link: remove the link, or pass --name or --results")
    if os.path.lexists(out) and not out.is_dir():
        raise OutputError(f"{out}: not a directory, so it cannot hold results; remove it, or pass --name or --results")


def check_results_root(results: Path, name: str) -> Path:
    """The directory a run of ``name`` stages into, created and written once as a probe.

    Raises :class:`~harness.errors.HarnessError` for a name that is not ``[a-z0-9_-]+`` (a
    path separator would write outside ``results``), and :class:`~harness.errors.OutputError`
    when ``results`` is a file or cannot be written, or ``results/<name>`` is a link or a file
    (a run replaces it as a whole). Leftovers of an earlier run at the staging name are removed
    without following a link.
    """
    if not NAME.fullmatch(name):
        raise HarnessError(f"--name {name!r}: expected letters a-z, digits, '_' or '-' only "
                           f"(it names {results}/<name>/ and the figures beside it)")
    if results.exists() and not results.is_dir():
        raise OutputError(f"{results}: the results root is a file, not a directory; pass --results DIR")
    _check_replaceable(results / name)
    staging = results / f".{name}.partial"
    try:
        _remove(staging)
        staging.mkdir(parents=True)
    except OSError as exc:
        raise OutputError(f"{results}: cannot write results there ({exc.strerror or exc})") from exc
    write_atomic(staging / ".probe", b"")
    (staging / ".probe").unlink()
    return staging


def publish(staging: Path, out: Path) -> None:
    """Put the finished run at ``out``, replacing the earlier one only once the new one is complete.

    The earlier one is renamed to ``.<name>.old`` beside it and removed after; neither that
    name nor ``out`` is ever followed if it is a link (``out`` as a link is refused). Raises
    :class:`~harness.errors.OutputError` naming ``staging`` (where the new results stay) when
    ``out`` cannot be replaced.
    """
    old = out.with_name(f".{out.name}.old")
    try:
        _check_replaceable(out)  # made at the start; checked again, as anything may have come there since
    except OutputError as exc:
        raise OutputError(f"{exc}; the new results are in {staging}") from exc
    try:
        _remove(old)
        if os.path.lexists(out):
            os.replace(out, old)
        os.replace(staging, out)
    except OSError as exc:
        raise OutputError(f"{out}: cannot put the new results in place ({exc.strerror or exc}); "
                          f"they are in {staging}") from exc
    with contextlib.suppress(OSError):
        _remove(old)
