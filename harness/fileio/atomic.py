"""The harness's one way of writing a file: a temporary file beside it, fsync, rename, fsync the directory.

Every file the harness writes (records, samples, events, plans, figures, reports, its one-off
conversions, the scratch files between its processes) goes through :func:`atomic_file` (a file
written as a stream, such as ``torch.save``'s) or :func:`write_atomic` (bytes or text in hand), so
a reader never sees half a file, an interrupted or failed write leaves the previous file as it
was, and a written file survives a crash. Files that belong together (a report and its figures)
go through a :class:`FileBatch`: all of them are put in place, or none. Checkpoints are written
by :func:`weightmap.write_checkpoint`, which does the same.

What does not go through it, and why (each says so where it is written):

* engines a compiler writes itself (OpenVINO's blob, AOTInductor's package, IREE's module): the
  compiler chooses how it writes; each is scratch of one run, removed when it ends, and is
  flushed and dropped from the page cache (:func:`harness.measure.coldcache.write_back_and_drop`);
* kernel interface files (a memory cgroup's ``memory.max``, ``/proc/self/clear_refs``): written in
  place, as the kernel reads them;
* a staging directory's lock (:mod:`harness.results.publish`): the file locked must stay the one
  other runs open, so it cannot be replaced by a rename;
* the disk measurement's own file (:mod:`harness.measure.shared_disk`): its writes are what it
  measures, and it is removed after.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from harness.errors import OutputError

__all__ = ["FileBatch", "atomic_file", "write_atomic", "write_json"]


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on a directory; the rename still happened
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def _temporary(target: Path) -> Iterator[tuple[BinaryIO, str]]:
    """A new temporary file beside ``target`` open for writing, and its path; once the block ends it is
    flushed to disk (fsync) and closed; when the block raises, it is removed."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle, tmp
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _write_temporary(target: Path, payload: bytes) -> str:
    """``payload`` in a new temporary file beside ``target``, flushed to disk; returns the temporary's path."""
    with _temporary(target) as (handle, tmp):
        handle.write(payload)
    return tmp


def _payload(data: bytes | str) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else data


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary file to write ``path`` through, put in place atomically and durably when the block ends.

    What the block writes goes to a temporary file beside ``path``; once the block ends it is flushed to
    disk, renamed to ``path`` and the directory flushed. Parent directories are created. When the block
    raises, or the write fails, the temporary file is removed and the previous file, if any, is unchanged;
    an :class:`OSError` becomes :class:`~harness.errors.OutputError` naming the path and the system's
    reason (read-only, no space left, ...). A link at ``path`` is replaced, not written through.
    """
    target = Path(path)
    try:
        with _temporary(target) as (handle, tmp):
            yield handle
        try:
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _fsync_directory(target.parent)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise OutputError(f"{target}: cannot write ({reason}); any earlier file there is unchanged") from exc


def write_atomic(path: str | os.PathLike[str], data: bytes | str) -> Path:
    """Write ``data`` (``str`` as UTF-8) to ``path`` with :func:`atomic_file`; returns the path."""
    with atomic_file(path) as handle:
        handle.write(_payload(data))
    return Path(path)


class FileBatch:
    """Files that are put in place together, or not at all (a report and its figures, say).

    :meth:`write` writes each file under a temporary name beside its target, as
    :func:`atomic_file` does; :meth:`commit` renames them all into place once every one
    is written. A failed write, or leaving the ``with`` block without committing, removes
    the temporary files and leaves every earlier file as it was: ``unchanged`` says so in
    the error, in the caller's words.
    """

    def __init__(self, unchanged: str = "the earlier files are unchanged") -> None:
        self.unchanged = unchanged
        self._pending: list[tuple[str, Path]] = []

    def __enter__(self) -> FileBatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()

    def write(self, path: str | os.PathLike[str], data: bytes | str) -> Path:
        """Write ``data`` under a temporary name beside ``path``; it goes to ``path`` on :meth:`commit`."""
        target = Path(path)
        try:
            self._pending.append((_write_temporary(target, _payload(data)), target))
        except OSError as exc:
            self.discard()
            raise OutputError(f"{target}: cannot write ({exc.strerror or exc}); {self.unchanged}") from exc
        return target

    def commit(self) -> list[Path]:
        """Put every written file in place (each a rename); returns their paths in the order written."""
        done: list[Path] = []
        try:
            for tmp, target in self._pending:
                os.replace(tmp, target)
                done.append(target)
        except OSError as exc:
            self.discard()
            replaced = f"; already replaced: {', '.join(p.name for p in done)}" if done else f"; {self.unchanged}"
            raise OutputError(f"{target}: cannot put it in place ({exc.strerror or exc}){replaced}") from exc
        self._pending = []
        for directory in dict.fromkeys(p.parent for p in done):
            _fsync_directory(directory)
        return done

    def discard(self) -> None:
        """Remove the files not yet put in place."""
        for tmp, _ in self._pending:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        self._pending = []


def write_json(path: str | os.PathLike[str], data: Any) -> Path:
    """``data`` as indented JSON, written with :func:`write_atomic`."""
    return write_atomic(path, json.dumps(data, indent=1) + "\n")
