"""Opening checkpoint files once, safely, and mapping the file that was checked.

Every checkpoint file (and every index) is opened exactly once, by
:func:`open_regular`, and everything after that works on the descriptor, never on
the path again:

* the path is classified with ``os.stat`` before it is opened, and the descriptor
  with ``os.fstat`` after (``O_NONBLOCK``, so a FIFO swapped in between cannot
  block the open): anything but a regular file is a :class:`MappingError` that
  says what the path is: missing, a dangling symbolic link, a symbolic link
  loop, a directory, a named pipe, a character or block device, a socket;
* the header is read from the descriptor (``os.pread``) and validated by
  :func:`weightmap.format.parse_header`;
* :meth:`CheckpointFile.map` maps that same descriptor, so a file renamed over the
  path in the meantime cannot be mapped in its place. Right before and right
  after mapping, the descriptor is ``fstat``-ed again and its header re-read: a
  file truncated, grown or rewritten since its header was validated (size,
  modification time or header bytes differ) is a :class:`MappingError`, never a
  silent mapping of something else.

What no check can prevent: a file truncated by another process *after* it was
mapped. Every mapped page wholly past the new end is a ``SIGBUS`` on its next
access (even one already read or written), and the page holding the new end reads
zeros past it, silently: a tensor straddling the new end reads its tail as zeros.
That is how ``mmap`` works; keep checkpoints immutable while they are mapped.
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path

from weightmap import registry
from weightmap.errors import MappingError
from weightmap.filekinds import non_regular_kind
from weightmap.format import MAX_HEADER_BYTES, Header, parse_header

__all__ = ["CheckpointFile", "FileIdentity", "describe_unusable", "open_regular", "read_all"]

_LENGTH_BYTES = 8
_FIRST_READ = 4096  # one read covers the length and a small header; a larger one takes a second read
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)



@dataclass(frozen=True)
class FileIdentity:
    """What ``fstat`` says about a file, as far as "is it still the file that was validated" goes."""

    device: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _why_missing(path: Path, exc: OSError) -> str:
    """The reason ``os.stat``/``os.open`` failed, said as what the path is."""
    if exc.errno == errno.ENOENT:
        try:
            target = os.readlink(path)
        except OSError:
            return "does not exist"
        return f"is a symbolic link to {target!r}, which does not exist"
    if exc.errno == errno.ELOOP:
        return "is a symbolic link loop (too many levels of symbolic links)"
    if exc.errno == errno.ENOTDIR:
        return "does not exist (a component of the path is not a directory)"
    return f"cannot be opened: {exc.strerror or exc}"


def describe_unusable(path: Path) -> str | None:
    """Why ``path`` cannot be a checkpoint file ("does not exist", "is a directory", ...); None if it can.

    Follows symbolic links, as opening does. Never opens the path, so a FIFO or a
    device is classified without side effects.
    """
    try:
        st = os.stat(path)
    except OSError as exc:
        return _why_missing(path, exc)
    kind = non_regular_kind(st.st_mode)
    return None if kind is None else f"is {kind}, not a regular file"


def open_regular(path: Path) -> CheckpointFile:
    """Open ``path`` read-only, once, and check that it is a regular file.

    Raises :class:`MappingError` naming the path and saying what it is when it is
    not a regular file or cannot be opened.
    """
    problem = describe_unusable(path)
    if problem is not None:
        raise MappingError(f"{path}: {problem}")
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:  # changed since the stat above, or not readable
        raise MappingError(f"{path}: {_why_missing(path, exc)}") from exc
    try:
        st = os.fstat(fd)
        kind = non_regular_kind(st.st_mode)
        if kind is not None:  # replaced between the stat and the open
            raise MappingError(f"{path}: is {kind}, not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return CheckpointFile(path, fd, FileIdentity.of(st))


def _pread_all(fd: int, count: int, offset: int) -> bytes:
    """Up to ``count`` bytes from ``offset`` (fewer only at the end of the file)."""
    chunks, got = [], 0
    while got < count:
        chunk = os.pread(fd, count - got, offset + got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _advise(fd: int, advice: str) -> None:
    """``posix_fadvise`` of the whole file where the platform has it (advice only: never fails a read)."""
    if hasattr(os, "posix_fadvise") and hasattr(os, advice):
        os.posix_fadvise(fd, 0, 0, getattr(os, advice))


def read_all(file: CheckpointFile, limit: int) -> bytes:
    """The whole file, which must be at most ``limit`` bytes (checked by the caller on the result)."""
    return _pread_all(file.fd, limit + 1, 0)


class CheckpointFile:
    """One opened checkpoint file: its path, its descriptor and what ``fstat`` said when it was opened.

    :meth:`read_header` reads and validates the header from the descriptor;
    :meth:`map` maps the descriptor after checking the file is unchanged. The
    descriptor is closed by :meth:`close` (idempotent; an object dropped while
    still open closes it too, with a ``ResourceWarning``); the mappings made from
    it do not need it.
    """

    def __init__(self, path: Path, fd: int, identity: FileIdentity) -> None:
        self.path = path
        self.identity = identity
        self._fd = fd
        self._header_digest: bytes | None = None
        self._header_length = 0

    @property
    def fd(self) -> int:
        if self._fd < 0:
            raise ValueError(f"{self.path}: the checkpoint file was closed")
        return self._fd

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __del__(self) -> None:  # a checkpoint kept open and never closed: do not leak the descriptor
        if getattr(self, "_fd", -1) >= 0:
            warnings.warn(f"unclosed checkpoint file {str(self.path)!r}", ResourceWarning, stacklevel=1)
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"fd={self._fd}"
        return f"CheckpointFile({str(self.path)!r}, {state}, size={self.identity.size})"

    def read(self, offset: int, count: int) -> bytes:
        """``count`` bytes from ``offset`` of the descriptor (fewer only past the end); a
        :class:`MappingError` naming the file if the read fails."""
        try:
            return _pread_all(self.fd, count, offset)
        except OSError as exc:
            where = f"bytes {offset}-{offset + count}"
            raise MappingError(f"{self.path}: cannot read {where}: {exc.strerror or exc}") from exc

    def _raw_header(self) -> bytes:
        """The file's first bytes: the length and the whole header when the length is plausible.

        Read with the kernel's read-ahead off (``POSIX_FADV_RANDOM``, normal again after), so
        that reading a header brings no weight into the page cache beyond the page the
        header ends in: with read-ahead, a 64 KiB read brought about a MiB of weights.
        """
        size = self.identity.size
        try:
            _advise(self.fd, "POSIX_FADV_RANDOM")
            try:
                raw = _pread_all(self.fd, min(size, _FIRST_READ), 0)
                if len(raw) >= _LENGTH_BYTES:
                    (length,) = struct.unpack_from("<Q", raw)
                    wanted = _LENGTH_BYTES + length
                    if length <= MAX_HEADER_BYTES and wanted <= size and wanted > len(raw):
                        raw += _pread_all(self.fd, wanted - len(raw), len(raw))
            finally:
                _advise(self.fd, "POSIX_FADV_NORMAL")
        except OSError as exc:
            raise MappingError(f"{self.path}: cannot read the header: {exc.strerror or exc}") from exc
        return raw

    def read_header(self) -> Header:
        """Read the header from the descriptor and validate it (:class:`HeaderError` if it breaks a rule)."""
        raw = self._raw_header()
        header = parse_header(raw, self.identity.size, self.path)
        self._header_length = header.data_start
        self._header_digest = hashlib.blake2b(raw[: header.data_start]).digest()
        return header

    def check_unchanged(self) -> None:
        """Raise :class:`MappingError` unless the file is still the one whose header was validated."""
        try:
            now = FileIdentity.of(os.fstat(self.fd))
            raw = _pread_all(self.fd, self._header_length, 0)
        except OSError as exc:
            raise MappingError(f"{self.path}: cannot check the file before mapping: {exc.strerror or exc}") from exc
        was = self.identity
        changes = []
        if now.size != was.size:
            changes.append(f"size {was.size} -> {now.size} bytes")
        if now.mtime_ns != was.mtime_ns:
            changes.append("modification time changed")
        if not changes and hashlib.blake2b(raw).digest() != self._header_digest:
            changes.append("header bytes differ")
        if changes:
            raise MappingError(
                f"{self.path}: the file changed after its header was validated ({'; '.join(changes)}): "
                "not mapped. A checkpoint must not be written while it is mapped."
            )

    def map(self) -> mmap.mmap:
        """Map this descriptor copy-on-write (see :mod:`weightmap.registry`), checking the file before and after."""
        if self._header_digest is None:
            raise ValueError(f"{self.path}: read_header() must validate the file before it is mapped")
        self.check_unchanged()
        mm = registry.map_descriptor(self.fd, self.identity.size, self.path)
        try:
            self.check_unchanged()  # closes the window between the check above and the mapping
        except MappingError:
            del mm  # no view uses it yet: this unmaps it
            raise
        return mm
