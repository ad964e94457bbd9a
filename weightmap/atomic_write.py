"""Write a file under its final name in one step, never leaving a temporary file behind.

:class:`AtomicFile` writes the new content to a new file in the target's directory,
flushes it to disk and renames it onto the target: readers see the old file or the
complete new one, never a part of it, and a process that has the old file mapped keeps
reading the old pages (the rename leaves the old inode alive while it is mapped).

How the new file is made (Linux and other POSIX systems):

* Where the file system supports ``O_TMPFILE`` (Linux: ext4, xfs, btrfs, tmpfs, ...),
  the new file has no name while it is written, so nothing can be left behind whatever
  happens to the process, ``SIGKILL`` and power loss included. Once complete it is
  linked in under a hidden name (``linkat`` through ``/proc/self/fd``) and renamed onto
  the target at once; only a kill in the microseconds between those two calls can
  leave that name behind, and the next save in the directory removes it.
* Elsewhere the new file is written under a hidden name,
  ``.<name>.<16 hex digits>.weightmap-tmp``, which its writer holds locked (``flock``)
  until it is renamed or removed. An exception removes it. A process killed mid-write
  leaves it, and the next save in that directory removes every such file whose lock is
  free, that is, whose writer is gone; files of writers still running are left alone.

What the new file inherits: replacing a file keeps its permission bits (a 0600
checkpoint stays 0600), and its owner and group where this process may set them; a new
file gets the default permissions, 0666 less the umask. A symlink is followed: the file
it points to is replaced and the link itself is left as it is (a dangling link gets its
target created). With ``follow_symlinks=False`` the name itself is replaced instead: a
symlink there is swapped for the new regular file by the rename, and the file it points
to is never opened for writing nor renamed onto (it may be shared, as the blobs of the
Hugging Face cache are); the new file takes the permission bits of the file the link
pointed to. The target must be a regular file (or a link to one) or absent: a directory
raises ``IsADirectoryError``, a FIFO, socket or device ``OSError``, and a symlink loop
``OSError`` (``ELOOP``).

Errors from the operating system (no space left, a missing or read-only directory, a
quota, an I/O error) are raised as :class:`OSError` with the original ``errno``, so of
the same subclass (``FileNotFoundError``, ``PermissionError``, ...), whose message and
``filename`` name the target, not the hidden file, and say that whatever was at the
target is unchanged; the original error is chained as ``__cause__``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
from pathlib import Path
from types import TracebackType

try:
    import fcntl
except ImportError:  # not POSIX: no locks, so abandoned files are never taken for removable
    fcntl = None  # type: ignore[assignment]

__all__ = ["AtomicFile", "resolve_target", "try_lock"]

PathArg = str | os.PathLike[str]

SUFFIX = ".weightmap-tmp"
_TEMP_NAME = re.compile(r"\..*\.[0-9a-f]{16}" + re.escape(SUFFIX), re.DOTALL)
_NAME_PART = 64  # characters of the target's name kept in a hidden name (NAME_MAX is 255 bytes)
_CHUNK = 64 * 1024 * 1024
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# Errors with which a file system says it has no O_TMPFILE (EISDIR: kernels before 3.11).
_NO_TMPFILE = frozenset({errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOTSUP})
_UNCHANGED = "whatever was there is unchanged"


def _failure(exc: OSError, target: Path, doing: str) -> OSError:
    """``exc`` again (same errno, so same subclass), naming the target instead of a hidden file."""
    reason = exc.strerror or str(exc)
    return OSError(exc.errno, f"{reason} ({doing}; {_UNCHANGED})", str(target))


def resolve_target(path: PathArg) -> Path:
    """The file a write to ``path`` replaces: ``path`` itself, or the end of its symlink chain."""
    target = Path(os.fsdecode(path))
    if not os.path.islink(target):
        return target
    resolved = Path(os.path.realpath(target))
    if os.path.islink(resolved):  # realpath stops at a link it cannot resolve: a loop
        raise OSError(errno.ELOOP, "symlink loop: cannot tell which file to write", str(target))
    return resolved


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def try_lock(fd: int) -> bool | None:
    """Try to lock ``fd`` exclusively: True when locked, False when someone holds it, None when
    this file system has no locks."""
    if fcntl is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return None
    return True


def _remove_abandoned(dir_fd: int) -> None:
    """Remove the hidden files that writers killed mid-write left in the directory open as ``dir_fd``.

    A hidden file is abandoned when its name has this module's pattern and no process holds
    its lock. Files that cannot be opened, locked or removed are left alone.
    """
    try:
        names = os.listdir(dir_fd)
    except OSError:
        return
    for name in names:
        if not _TEMP_NAME.fullmatch(name):
            continue
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW | _CLOEXEC, dir_fd=dir_fd)
        except OSError:
            continue
        try:
            found = os.fstat(fd)
            # Locked by us, the name cannot be renamed or removed by its writer, so checking that
            # it still names this file and then removing it is race-free.
            if stat.S_ISREG(found.st_mode) and try_lock(fd) and _same_file(
                os.stat(name, dir_fd=dir_fd, follow_symlinks=False), found
            ):
                os.unlink(name, dir_fd=dir_fd)
        except OSError:
            pass
        finally:
            os.close(fd)


class AtomicFile:
    """A new file that replaces ``path`` when the ``with`` block ends without an exception.

    Use::

        with AtomicFile(path) as out:
            out.write(data)
            ...

    On an exception, including :class:`KeyboardInterrupt`, the new file is discarded and
    ``path`` is as it was. See the module docstring for how the new file is made, what it
    inherits and which errors are raised.

    With ``deferred=True`` the block's end only makes the new file complete and durable
    (``fsync``), still unnamed or under its locked hidden name: nothing is visible at
    ``path`` until :meth:`publish` renames it there, and :meth:`discard` drops it. That lets
    several files be written first and made visible in an order of the caller's choosing
    (:mod:`weightmap.commit`). A deferred file neither published nor discarded is dropped
    when the process ends: unnamed, it never had a name; hidden, the next save removes it.
    """

    def __init__(self, path: PathArg, *, deferred: bool = False, follow_symlinks: bool = True) -> None:
        self.path = Path(os.fsdecode(path))
        self.target = resolve_target(self.path) if follow_symlinks else self.path
        self.identity: tuple[int, int] | None = None  # (device, inode) of the new file, once published
        self._deferred = deferred
        self._dir_fd = -1
        self._fd = -1
        self._temp: str | None = None  # the hidden name, while the new file has one
        self._unnamed = False

    # ------------------------------------------------------------------ opening

    def __enter__(self) -> AtomicFile:
        target = self.target
        try:
            found = os.stat(target)
        except FileNotFoundError:
            found = None
        except OSError as exc:
            raise _failure(exc, target, "looking at the target") from exc
        if found is not None and stat.S_ISDIR(found.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory, cannot write a file onto it", str(target))
        if found is not None and not stat.S_ISREG(found.st_mode):
            raise OSError(errno.EINVAL, "is not a regular file (a FIFO, socket or device), not replacing it",
                          str(target))
        directory = target.parent
        try:
            self._dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
        except OSError as exc:
            raise _failure(exc, target, f"opening its directory {directory}") from exc
        try:
            _remove_abandoned(self._dir_fd)
            self._open(directory)
            if found is not None:
                self._inherit(found)
        except BaseException as exc:
            self._discard()
            if isinstance(exc, OSError):
                raise _failure(exc, target, f"creating the new file in {directory}") from exc
            raise
        return self

    def _open(self, directory: Path) -> None:
        fd = self._open_unnamed(directory)
        if fd is not None:
            self._fd, self._unnamed = fd, True
            try_lock(fd)  # held until the hidden name it is linked under is renamed
            return
        self._fd, self._temp = self._open_named()

    @staticmethod
    def _open_unnamed(directory: Path) -> int | None:
        """An ``O_TMPFILE`` descriptor in ``directory``, or None where that is not available."""
        flag = getattr(os, "O_TMPFILE", None)
        if flag is None or not os.path.isdir("/proc/self/fd"):
            return None
        try:
            # Read-write, so that its content can be copied out if it cannot be linked.
            return os.open(directory, flag | os.O_RDWR | _CLOEXEC, 0o666)
        except OSError as exc:
            if exc.errno in _NO_TMPFILE:
                return None
            raise

    def _open_named(self) -> tuple[int, str]:
        """A new file under a fresh hidden name, locked; returns its descriptor and name."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
        while True:
            name = f".{self.target.name[:_NAME_PART]}.{secrets.token_hex(8)}{SUFFIX}"
            try:
                fd = os.open(name, flags, 0o666, dir_fd=self._dir_fd)
            except FileExistsError:
                continue
            # Between the create and the lock another save may take the new file for abandoned
            # and remove it (its lock was free): then the name is gone, or names another file.
            locked = try_lock(fd)
            if locked is False:  # another save took it for abandoned and is removing it
                os.close(fd)
                continue
            if locked and not self._still_named(name, fd):
                os.close(fd)  # removed before we locked it: start again
                continue
            return fd, name

    def _still_named(self, name: str, fd: int) -> bool:
        """True when ``name`` in the target's directory is still the file open as ``fd``."""
        try:
            found = os.stat(name, dir_fd=self._dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return _same_file(found, os.fstat(fd))

    def _inherit(self, old: os.stat_result) -> None:
        """Give the new file the permission bits, and where allowed the owner, of the one it replaces."""
        mine = os.fstat(self._fd)
        if (mine.st_uid, mine.st_gid) != (old.st_uid, old.st_gid):
            with contextlib.suppress(PermissionError):
                os.fchown(self._fd, old.st_uid, old.st_gid)
        os.fchmod(self._fd, stat.S_IMODE(old.st_mode))

    # ------------------------------------------------------------------ writing

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Write all of ``data`` (a single ``write`` call may write less)."""
        view = memoryview(data).cast("B")
        written = 0
        try:
            while written < len(view):
                written += os.write(self._fd, view[written : written + _CHUNK])
        except OSError as exc:
            raise _failure(exc, self.target, "writing the new file") from exc

    # ------------------------------------------------------------------ finishing

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if kind is not None:
            self._discard()
            return
        try:
            os.fsync(self._fd)
        except BaseException as error:
            self._discard()
            if isinstance(error, OSError):
                raise _failure(error, self.target, "flushing the new file to disk") from error
            raise
        if not self._deferred:
            self.publish()

    def publish(self) -> None:
        """Rename the complete new file onto its target (done by the ``with`` block unless deferred).

        On a failure the new file is discarded and the target is as it was. :attr:`identity`
        is set, right before the rename, to the new file's ``(st_dev, st_ino)``: whoever must
        tell whether the name now holds this file (to undo the rename) compares with it.
        """
        if self._fd < 0:
            raise ValueError(f"{self.target}: the new file was already published or discarded")
        try:
            if self._unnamed:
                self._link()
            assert self._temp is not None
            mine = os.fstat(self._fd)
            self.identity = (mine.st_dev, mine.st_ino)
            os.replace(self._temp, self.target.name, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
            self._temp = None
            with contextlib.suppress(OSError):  # makes the rename durable where directories can be synced
                os.fsync(self._dir_fd)
            self._close()
        except BaseException as error:
            self._discard()
            if isinstance(error, OSError):
                raise _failure(error, self.target, "putting the new file in place") from error
            raise

    def discard(self) -> None:
        """Drop the new file (a deferred one not yet published); the target is left as it is. Never raises."""
        self._discard()

    def _link(self) -> None:
        """Give the unnamed file a hidden name, locked as it is (it was locked when opened).

        Where the link is refused (``/proc`` hidden, say), the content is copied into a new
        named file instead.
        """
        name = f".{self.target.name[:_NAME_PART]}.{secrets.token_hex(8)}{SUFFIX}"
        try:
            # dst_dir_fd makes Python call linkat(..., AT_SYMLINK_FOLLOW): plain link(2) would
            # link the /proc symlink itself and fail with EXDEV.
            os.link(f"/proc/self/fd/{self._fd}", name, dst_dir_fd=self._dir_fd, follow_symlinks=True)
        except OSError:
            unnamed = self._fd
            self._fd, self._temp = self._open_named()
            self._unnamed = False
            try:
                _copy(unnamed, self._fd)
            finally:
                os.close(unnamed)
            os.fsync(self._fd)
            return
        self._temp, self._unnamed = name, False

    def _discard(self) -> None:
        """Remove the new file (if it has a name) and close everything; never raises."""
        if self._temp is not None and self._dir_fd >= 0:
            with contextlib.suppress(OSError):
                os.unlink(self._temp, dir_fd=self._dir_fd)
            self._temp = None
        self._close()

    def _close(self) -> None:
        for fd in (self._fd, self._dir_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fd = self._dir_fd = -1


def _copy(source: int, destination: int) -> None:
    """Copy all of the file open (readable) as ``source`` to ``destination``."""
    size, offset = os.fstat(source).st_size, 0
    while offset < size:
        chunk = os.pread(source, min(size - offset, _CHUNK), offset)
        if not chunk:
            break
        view = memoryview(chunk)
        while view:
            view = view[os.write(destination, view) :]
        offset += len(chunk)
