"""How a finished run's directory gets to ``results/<name>/``: staged beside it, then put in place at once.

A run (or a budget sweep) writes into ``results/.<name>.partial/``, held for the run's life by a
:class:`Staging`, and :func:`publish` replaces ``results/<name>/`` with it only once everything is
written: an interrupted run or a full disk leaves the earlier results as they were.
``results/<name>`` that is a link or a file is refused, before the run and again at publishing;
leftovers at ``.<name>.partial`` and ``.<name>.old`` are removed without following links.

No staging directory outlives its run for nothing. A run that fails or is interrupted removes its
own, unless it holds finished strategies: then it is kept and the error says where, and which.
Whether a staging directory's run is still going is told by a lock: the run holds an exclusive
``flock`` on ``.lock`` inside it for its whole life (the kernel lets go when the process dies,
however it dies), with the run's process id in it for messages. The next run, of any name,
removes every staging directory whose lock nobody holds (``.<name>.partial``, and the
``.<name>.partial.<random>`` earlier versions made it as), and refuses to start where a run of the
same name still holds one. A staging directory its own run is removing as it ends can be found stale
meanwhile (its lock already unlinked): both remove it, and what the other removed first is no error
(:func:`_remove_tree`); only a real failure is reported.

Starts take turns: each removes stale staging directories and makes and locks its own while it holds
an exclusive ``flock`` on the results root itself (:func:`_root_locked`), so no start ever finds
another's directory between its making and its locking, which it would take for stale and remove.
A staging directory is made with the mode ``0o777`` less the umask, as the published results keep.
``results/.gitignore`` keeps these names out of ``git status``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType

from harness.errors import HarnessError, OutputError
from harness.fileio.atomic import write_atomic
from harness.results.record import NAME
from harness.stopping import RunInterrupted

__all__ = ["FILE_NAME_BYTES", "LOCK", "MAX_NAME_CHARS", "Staging", "check_results_root", "publish", "staging_dir"]

LOCK = ".lock"
"""In a staging directory: the file its run holds an exclusive ``flock`` on, with the run's process id."""

Finished = Callable[[Path], Sequence[str]]
"""``staging directory -> names of the strategies that finished there`` (a run's, or a sweep's)."""


def _remove_tree(path: Path) -> None:
    """Remove the directory tree at ``path`` (links in it unlinked, never followed). What is already gone, removed
    meanwhile by another process (a run removing its own staging directory as it ends), is no error: only a real
    failure raises (``OSError``)."""
    def gone_is_removed(exc: BaseException) -> None:
        if not isinstance(exc, FileNotFoundError):
            raise exc

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=lambda function, name, exc: gone_is_removed(exc))
    else:
        shutil.rmtree(path, onerror=lambda function, name, exc_info: gone_is_removed(exc_info[1]))


def _remove(path: Path) -> None:
    """Remove what is at ``path`` without following a link: a link or file is unlinked, a directory removed
    (:func:`_remove_tree`); what is gone already is no error."""
    if path.is_symlink() or (os.path.lexists(path) and not path.is_dir()):
        path.unlink(missing_ok=True)
    elif path.is_dir():
        _remove_tree(path)


def _check_replaceable(out: Path) -> None:
    """Refuse an ``out`` that a run could not replace as a whole: a link (it would be followed or
    replaced by a directory) or something other than a directory."""
    if out.is_symlink():
        raise OutputError(f"{out}: a symbolic link (to {os.readlink(out)}); the results are replaced as a whole "
                          f"and never through a link: remove the link, or pass --name or --results")
    if os.path.lexists(out) and not out.is_dir():
        raise OutputError(f"{out}: not a directory, so it cannot hold results; remove it, or pass --name or --results")


def staging_dir(results: Path, name: str) -> Path:
    """Where a run of ``name`` stages its results: ``results/.<name>.partial``."""
    return results / f".{name}.partial"


def _is_staging(path: Path) -> bool:
    name = path.name
    return name.startswith(".") and (name.endswith(".partial") or ".partial." in name)


def _lock(directory: Path) -> int:
    """``directory/.lock``, open and held with an exclusive ``flock``; ``BlockingIOError`` when a live run holds it.

    Made and written in place, not with the atomic writer (:mod:`harness.fileio.atomic`): a rename would put
    another file at the name, and the lock is on the file other runs open there."""
    fd = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def _root_locked(results: Path) -> Iterator[None]:
    """An exclusive ``flock`` on the directory ``results`` itself while the block runs (waiting for it): the
    section in which a start removes stale staging directories and makes and locks its own."""
    fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # lets the lock go


def _owner(directory: Path) -> str:
    """``process <pid>``, as the run holding ``directory``'s lock wrote it, or ``another process``."""
    with contextlib.suppress(OSError, ValueError):
        return f"process {int((directory / LOCK).read_text())}"
    return "another process"


def _remove_stale(results: Path, say: Callable[[str], None]) -> None:
    """Remove every staging directory under ``results`` whose run no longer holds it (see the module); called
    with the root locked (:func:`_root_locked`), so that none is removed between its making and its locking."""
    for path in sorted(results.iterdir()):
        if not _is_staging(path):
            continue
        if path.is_symlink() or not path.is_dir():
            with contextlib.suppress(OSError):
                _remove(path)
            continue
        try:
            fd = _lock(path)
        except OSError:  # held by a live run (BlockingIOError), or gone or unreadable meanwhile
            continue
        try:
            _remove_tree(path)
            say(f"removed {path}: left by a run that is no longer running")
        except OSError as exc:
            say(f"could not remove {path}, left by a run that is no longer running ({exc.strerror or exc})")
        finally:
            os.close(fd)


FILE_NAME_BYTES = 255
"""The longest file name Linux file systems take (``NAME_MAX``)."""

MAX_NAME_CHARS = 200
"""The longest results name. The file names made from it add up to 31 characters to it (the longest, a
figure's temporary file: a dot, the figure's name, a dot, 8 random characters and ``.tmp``, the
engine-times figure's name adding 17; the staging directory ``.<name>.partial`` adds 9): this leaves
them room under :data:`FILE_NAME_BYTES`."""


def _shown(text: str) -> str:
    """``text`` for a one-line message: quoted, a long one cut to its first 40 characters."""
    return repr(text) if len(text) <= 48 else f"{text[:40]!r}... ({len(text)} characters)"


def check_results_root(results: Path, name: str) -> None:
    """Refuse, before anything is written, results a run of ``name`` could not write or publish.

    Raises :class:`~harness.errors.HarnessError` for a name that is not ``[a-z0-9_-]+`` (a
    path separator would write outside ``results``) or is longer than :data:`MAX_NAME_CHARS`, and
    for a ``results`` path holding a NUL byte or a part longer than :data:`FILE_NAME_BYTES`; and
    :class:`~harness.errors.OutputError` when ``results`` is a file, or ``results/<name>`` is a link or a
    file (a run replaces it as a whole).
    """
    if not NAME.fullmatch(name):
        raise HarnessError(f"--name {_shown(name)}: expected letters a-z, digits, '_' or '-' only "
                           f"(it names {results}/<name>/ and the figures beside it)")
    if len(name) > MAX_NAME_CHARS:
        raise HarnessError(f"--name {_shown(name)}: at most {MAX_NAME_CHARS} characters (the files named after "
                           f"it, such as its staging directory .<name>.partial, must fit the {FILE_NAME_BYTES} "
                           f"bytes of a file name)")
    text = str(results)
    if "\0" in text:
        raise HarnessError(f"--results {_shown(text)}: a path cannot hold a NUL byte")
    long = next((part for part in results.parts if len(os.fsencode(part)) > FILE_NAME_BYTES), None)
    if long is not None:
        raise HarnessError(f"--results {_shown(text)}: its part {_shown(long)} is longer than the "
                           f"{FILE_NAME_BYTES} bytes of a file name")
    if results.exists() and not results.is_dir():
        raise OutputError(f"{results}: the results root is a file, not a directory; pass --results DIR")
    _check_replaceable(results / name)


class Staging:
    """A run's staging directory, ``results/.<name>.partial/``, held for the run's life; a context manager.

    On entry (:meth:`__enter__`, which returns the directory): the checks of :func:`check_results_root`;
    stale staging directories of any name removed (each said through ``say``); an
    :class:`~harness.errors.OutputError` when a live run of ``name`` holds its staging directory;
    then the directory made and locked (both with the results root locked: see the module), and written
    once as a probe (``OutputError`` when ``results`` cannot be written).

    On an exception (a failed or interrupted run, the staging directory not yet published):
    ``finished(directory)`` names the strategies that finished there. None: the directory is
    removed. Some: it is kept, and :attr:`note` (``; kept <directory> until the next run, for its
    finished strategies a, b``) is added to the error's message when it is a
    :class:`~harness.errors.HarnessError`, to its notes otherwise. ``KeyboardInterrupt``
    becomes :class:`~harness.stopping.RunInterrupted` (SIGINT), saying that ``results/<name>`` is unchanged.
    The lock is let go on the way out, however the run ends.
    """

    def __init__(self, results: Path, name: str, finished: Finished, say: Callable[[str], None]) -> None:
        self.results, self.name, self.finished, self.say = Path(results), name, finished, say
        self.path = staging_dir(self.results, name)
        self.note = ""
        self._fd: int | None = None

    def __enter__(self) -> Path:
        check_results_root(self.results, self.name)
        made = False
        try:
            self.results.mkdir(parents=True, exist_ok=True)
            with _root_locked(self.results):  # no other start removes or makes one meanwhile
                _remove_stale(self.results, self.say)
                if os.path.lexists(self.path):  # still there: a live run holds it
                    raise OutputError(f"{self.path}: a run of {self.name} is in progress ({_owner(self.path)}); "
                                      f"wait for it to end, or pass --name")
                self.path.mkdir()  # 0o777 less the umask
                made = True
                self._fd = _lock(self.path)
                os.write(self._fd, f"{os.getpid()}\n".encode())
        except OSError as exc:
            if made:
                shutil.rmtree(self.path, ignore_errors=True)
            self._release()
            if isinstance(exc, OutputError):
                raise
            raise OutputError(f"{self.results}: cannot write results there ({exc.strerror or exc})") from exc
        try:
            write_atomic(self.path / ".probe", b"")
            (self.path / ".probe").unlink()
        except BaseException:
            shutil.rmtree(self.path, ignore_errors=True)
            self._release()
            raise
        return self.path

    def _release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _settle(self) -> None:
        """Keep the staging directory when something finished there (and say so in :attr:`note`), else remove it."""
        if self.path.is_symlink() or not self.path.is_dir():
            return  # published, or never made
        done = list(self.finished(self.path))
        if done:
            self.note = f"; kept {self.path} until the next run, for its finished strategies {', '.join(done)}"
        else:
            with contextlib.suppress(OSError):
                _remove_tree(self.path)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if exc is not None and self._fd is not None:
                self._settle()
        finally:
            self._release()
        if isinstance(exc, KeyboardInterrupt):
            raise RunInterrupted(f"interrupted by SIGINT; {self.results / self.name} is unchanged{self.note}",
                                 signal.SIGINT) from None
        if self.note and isinstance(exc, HarnessError):
            exc.args = (f"{exc}{self.note}",)
        elif self.note and exc is not None:
            exc.add_note(self.note.removeprefix("; "))


def publish(staging: Path, out: Path) -> None:
    """Put the finished run at ``out``, replacing the earlier one only once the new one is complete.

    The earlier one is renamed to ``.<name>.old`` beside it and removed after (put back
    when the new one cannot be moved in); neither that name nor ``out`` is ever followed if
    it is a link (``out`` as a link is refused). The staging directory's :data:`LOCK` is
    removed from the published results (its run still holds it, open). Raises
    :class:`~harness.errors.OutputError` when ``out`` cannot be replaced; ``staging`` stays.
    """
    old = out.with_name(f".{out.name}.old")
    _check_replaceable(out)  # made at the start; checked again, as anything may have come there since
    try:
        _remove(old)
        if os.path.lexists(out):
            os.replace(out, old)
        try:
            os.replace(staging, out)
        except OSError:
            if os.path.lexists(old) and not os.path.lexists(out):
                os.replace(old, out)
            raise
    except OSError as exc:
        raise OutputError(f"{out}: cannot put the new results in place ({exc.strerror or exc})") from exc
    with contextlib.suppress(OSError):
        (out / LOCK).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        _remove(old)
