"""Replacing the checkpoint a directory holds as a whole: old or new, never a mix of both.

A directory is read (:func:`weightmap.checkpoint.open_checkpoint`) through its
``model.safetensors.index.json`` when it has one, else through its only visible
``*.safetensors`` file. :func:`replace_checkpoint` puts a new checkpoint there (files
already written completely, unnamed or hidden: ``AtomicFile(..., deferred=True)``) so
that at every instant the directory reads either as the complete earlier checkpoint or
as the complete new one, whatever happens to the process:

1. *park* (only where the new files could disturb the earlier checkpoint: a new name
   equal to one of its files, shards beside a lone file, a lone file beside shards):
   every file of the earlier checkpoint gets a second, hidden name
   (``.<name>.<16 hex>.weightmap-old``, a hard link: no data is copied), an index that
   names those hidden names replaces (or adds) the directory's index, and the visible
   names are removed. The directory still reads as the earlier checkpoint;
2. *publish*: the new files are renamed to their names, which no index in use names;
3. *commit*: the new index is renamed onto ``model.safetensors.index.json`` (new shards),
   or the directory's index is removed (a new lone ``model.safetensors``). From here the
   directory reads as the new checkpoint;
4. *clean*: the earlier checkpoint's files (hidden or not) are removed.

An error before the commit puts back what was changed (the new files removed, parked
names and index restored) and re-raises. A kill leaves the directory reading as one of
the two checkpoints, with at most the hidden names of step 1 or the new files of step 2
beside it. The directory is locked (``flock``) while this runs: a second conversion into
it at the same time is refused, not interleaved.

A directory that holds files the reader cannot make a checkpoint of (several
``*.safetensors`` and no index, a broken index) is refused before anything is changed,
since replacing its content "as a whole" would mean deleting files that may not be an
earlier conversion's.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from weightmap.atomic_write import AtomicFile, try_lock
from weightmap.checkpoint import INDEX_NAME, open_checkpoint
from weightmap.errors import MappingError

__all__ = ["SINGLE_NAME", "Earlier", "earlier_checkpoint", "index_document", "locked_directory", "replace_checkpoint"]

SINGLE_NAME = "model.safetensors"
_PARKED = ".weightmap-old"
_SUFFIX = ".safetensors"
_NAME_PART = 64


@dataclass(frozen=True)
class Earlier:
    """The checkpoint a directory holds now: its files (relative names) and how they are read."""

    files: tuple[str, ...]
    index: bytes | None  # the raw index when the directory is read through one; None for a lone file
    entries: dict[str, str]  # tensor name -> the relative name of the file that holds it


def index_document(weight_map: dict[str, str], total_size: int) -> bytes:
    """The bytes of a ``model.safetensors.index.json`` naming each tensor's shard."""
    document = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
    return json.dumps(document, indent=2, ensure_ascii=False).encode("utf-8") + b"\n"


def earlier_checkpoint(directory: Path) -> Earlier | None:
    """The checkpoint ``directory`` holds, None when it holds none (no index, no visible ``*.safetensors``).

    Raises :class:`MappingError` when the directory holds files that do not make a readable
    checkpoint: they are not replaced.
    """
    index = directory / INDEX_NAME
    has_index = os.path.lexists(index)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return None
    if not has_index and not any(n.endswith(_SUFFIX) and not n.startswith(".") for n in names):
        return None
    try:
        with open_checkpoint(directory) as checkpoint:
            files = tuple(os.path.relpath(path, directory) for path in checkpoint.files)
            entries = {name: os.path.relpath(h.path, directory) for name, (h, _) in checkpoint.entries.items()}
        raw = index.read_bytes() if has_index else None
    except (MappingError, OSError) as exc:
        raise MappingError(
            f"{directory}: holds files that are not a checkpoint weightmap can read, so they are not replaced "
            f"({exc}); remove them or write into another directory"
        ) from exc
    return Earlier(files=files, index=raw, entries=entries)


@contextlib.contextmanager
def locked_directory(directory: Path) -> Iterator[int]:
    """Hold an exclusive ``flock`` on ``directory`` (created if missing); refuse if another holds it."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        if try_lock(fd) is False:
            raise MappingError(f"{directory}: another conversion is writing into this directory; wait for it to end")
        yield fd
    finally:
        os.close(fd)


def _needs_parking(earlier: Earlier | None, new_names: set[str], sharded: bool) -> bool:
    if earlier is None:
        return False
    if sharded:
        return earlier.index is None or bool(new_names & set(earlier.files))
    return earlier.index is not None or earlier.files != (SINGLE_NAME,)


def _parked_name(name: str) -> str:
    return f".{Path(name).name[:_NAME_PART]}.{secrets.token_hex(8)}{_PARKED}"


class _Transaction:
    """One replacement in progress: what was changed so far, so that it can be put back."""

    def __init__(self, directory: Path, dir_fd: int, earlier: Earlier | None) -> None:
        self.directory = directory
        self.dir_fd = dir_fd
        self.earlier = earlier
        self.parked: dict[str, str] = {}  # visible name -> hidden name
        self.published: list[str] = []
        self.names_removed = False

    def _unlink(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.dir_fd)

    def park(self) -> None:
        earlier = self.earlier
        assert earlier is not None
        for name in earlier.files:
            hidden = _parked_name(name)
            os.link(name, hidden, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd, follow_symlinks=False)
            self.parked[name] = hidden
        weight_map = {tensor: self.parked[file] for tensor, file in earlier.entries.items()}
        with AtomicFile(self.directory / INDEX_NAME) as out:
            out.write(index_document(weight_map, 0))
        self.names_removed = True
        for name in earlier.files:
            self._unlink(name)

    def publish(self, files: Sequence[AtomicFile]) -> None:
        for staged in files:
            self.published.append(staged.target.name)
            staged.publish()

    def commit(self, index: bytes | None) -> None:
        if index is not None:
            with AtomicFile(self.directory / INDEX_NAME) as out:
                out.write(index)
        else:
            self._unlink(INDEX_NAME)

    def clean(self, keep: set[str]) -> None:
        """Remove the earlier checkpoint's files that the new one does not use (never raises)."""
        stale = set(self.parked.values())
        if self.earlier is not None and not self.names_removed:
            stale |= set(self.earlier.files) - keep
        for name in sorted(stale):
            with contextlib.suppress(OSError):
                self._unlink(name)
        with contextlib.suppress(OSError):
            os.fsync(self.dir_fd)

    def roll_back(self) -> None:
        """Put the earlier checkpoint back under its own names and index; never raises.

        Each step is tried on its own: one that fails leaves the directory reading as the
        earlier checkpoint all the same (through the parked names).
        """
        for name in self.published:
            with contextlib.suppress(OSError):
                self._unlink(name)
        if self.earlier is None or not self.parked:
            return
        restored = True
        if self.names_removed:
            for name, hidden in self.parked.items():
                try:
                    os.link(hidden, name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd, follow_symlinks=False)
                except FileExistsError:
                    pass  # not removed yet
                except OSError:
                    restored = False
            if not restored:
                return  # the parked index still reads as the earlier checkpoint: keep its names
            try:
                if self.earlier.index is not None:
                    with AtomicFile(self.directory / INDEX_NAME) as out:
                        out.write(self.earlier.index)
                else:
                    self._unlink(INDEX_NAME)
            except OSError:
                return
        for hidden in self.parked.values():
            with contextlib.suppress(OSError):
                self._unlink(hidden)


def replace_checkpoint(directory: Path, dir_fd: int, files: Sequence[AtomicFile], index: bytes | None) -> None:
    """Make ``files`` (deferred, complete) and ``index`` the checkpoint of ``directory``, as a whole.

    ``files`` are new files whose targets are in ``directory``; ``index`` is the new
    index's bytes (None for a single ``model.safetensors``). ``dir_fd`` is the directory,
    open and locked (:func:`locked_directory`). See the module docstring for the steps
    and what an error or a kill leaves. Raises :class:`MappingError` (the directory holds
    something that is not a readable checkpoint) or :class:`OSError`, after putting back
    whatever was changed.
    """
    earlier = earlier_checkpoint(directory)
    new_names = {staged.target.name for staged in files}
    transaction = _Transaction(directory, dir_fd, earlier)
    try:
        if _needs_parking(earlier, new_names, sharded=index is not None):
            transaction.park()
        transaction.publish(files)
        transaction.commit(index)
    except BaseException:
        transaction.roll_back()
        raise
    transaction.clean(keep=new_names | {INDEX_NAME})
