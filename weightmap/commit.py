"""Replacing the checkpoint a directory holds as a whole: old or new, never a mix of both.

A directory is read (:func:`weightmap.checkpoint.open_checkpoint`) through its
``model.safetensors.index.json`` when it has one, else through its only visible
``*.safetensors`` file. :func:`replace_checkpoint` puts a new checkpoint there (files
already written completely, unnamed or hidden: ``AtomicFile(..., deferred=True)``) so
that at every instant the directory reads either as the complete earlier checkpoint or
as the complete new one, whatever happens to the process.

What counts as the earlier checkpoint, the only files ever removed or replaced (the
naming convention transformers uses for its checkpoints):

* the index ``model.safetensors.index.json`` and every file it names, whatever their names;
* ``model.safetensors`` and ``model-NNNNN-of-NNNNN.safetensors`` files, also those no index
  names (an interrupted conversion's, or shards whose index is gone);
* the hidden ``.<name>.<16 hex>.weightmap-old`` names step 1 gives, also those a killed
  conversion left.

Every other file is left as it is. A directory that holds another visible
``*.safetensors`` (a LoRA's ``adapter_model.safetensors``, say) is refused before anything
is changed when it has no index (nothing says that file is not the directory's checkpoint)
or when the new checkpoint is a lone file (the directory would be left without an index
beside two ``*.safetensors``). So is a directory whose index or ``model.safetensors``
cannot be read. After a replacement the directory holds exactly one checkpoint.

Symbolic links (the Hugging Face cache links ``snapshots/<rev>/<file>`` to a shared
``blobs/<sha256>``) are names like any other: a name is given a second name, removed or
replaced, never written through nor renamed onto what it points to. A checkpoint of links
is replaced by regular files, and its links are removed once the new one is committed.

The steps:

0. *set aside*: checkpoint names that the directory does not read (no index names them)
   are given a hidden name and removed, so that none shadows or collides with the new
   checkpoint (transformers reads a ``model.safetensors`` before any index);
1. *park* (only where the new files could disturb the earlier checkpoint: a new name
   equal to one of its files, shards beside a lone file, a lone file beside shards):
   every file of the earlier checkpoint, and its index, gets a second, hidden name
   (``.<name>.<16 hex>.weightmap-old``, a hard link: no data is copied), an index that
   names those hidden names replaces (or adds) the directory's index, and the visible
   names are removed. The directory still reads as the earlier checkpoint;
2. *publish*: the new files are renamed to their names, which no index in use names;
3. *commit*: the new index is renamed onto ``model.safetensors.index.json`` (new shards),
   or the directory's index is removed (a new lone ``model.safetensors``). From here the
   directory reads as the new checkpoint;
4. *clean*: the earlier checkpoint's files (hidden or not) are removed, and so are the
   hidden names any earlier, interrupted replacement left.

An error before the commit puts back what was changed (the new files removed where their
names were free, parked and set-aside names and the index restored) and re-raises; it
never removes a name it did not create. A kill leaves the directory reading as one of the
two checkpoints, with at most the hidden names of steps 0 and 1 or the new files of step 2
beside it; the next replacement finishes the job (sets aside or removes them). The
directory is locked (``flock``) while this runs: a second conversion into it at the same
time is refused, not interleaved.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from weightmap.atomic_write import AtomicFile, try_lock
from weightmap.checkpoint import INDEX_NAME, open_checkpoint
from weightmap.errors import MappingError

__all__ = [
    "SINGLE_NAME", "Earlier", "checkpoint_to_replace", "earlier_checkpoint", "index_document", "is_checkpoint_name",
    "locked_directory", "replace_checkpoint",
]

SINGLE_NAME = "model.safetensors"
_PARKED = ".weightmap-old"
_SUFFIX = ".safetensors"
_NAME_PART = 64
_CHECKPOINT_NAME = re.compile(r"model(-[0-9]+-of-[0-9]+)?" + re.escape(_SUFFIX))
_PARKED_NAME = re.compile(r"\..*\.[0-9a-f]{16}" + re.escape(_PARKED), re.DOTALL)


def is_checkpoint_name(name: str) -> bool:
    """True for ``model.safetensors`` and ``model-NNNNN-of-NNNNN.safetensors``: transformers' checkpoint names."""
    return _CHECKPOINT_NAME.fullmatch(name) is not None


@dataclass(frozen=True)
class Earlier:
    """What a directory holds now: its checkpoint and what stands beside it (relative names)."""

    files: tuple[str, ...]  # the checkpoint the directory reads as; () when it holds none
    index: bool  # read through model.safetensors.index.json
    entries: dict[str, str]  # tensor name -> the relative name of the file that holds it
    stale: tuple[str, ...]  # checkpoint names the directory does not read (an interrupted conversion's)
    parked: tuple[str, ...]  # hidden names an interrupted replacement left, which nothing reads
    foreign: tuple[str, ...]  # other visible *.safetensors: never removed nor replaced


def index_document(weight_map: dict[str, str], total_size: int) -> bytes:
    """The bytes of a ``model.safetensors.index.json`` naming each tensor's shard."""
    document = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
    return json.dumps(document, indent=2, ensure_ascii=False).encode("utf-8") + b"\n"


def earlier_checkpoint(directory: Path) -> Earlier:
    """What ``directory`` holds (see the module docstring); an empty :class:`Earlier` when it is missing.

    The checkpoint is read through the index when there is one, else through
    ``model.safetensors`` when there is one. Raises :class:`MappingError` when that does not
    make a readable checkpoint: it is not replaced.
    """
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return Earlier(files=(), index=False, entries={}, stale=(), parked=(), foreign=())
    has_index = INDEX_NAME in names
    visible = [n for n in names if n.endswith(_SUFFIX) and not n.startswith(".")]
    read = directory if has_index else directory / SINGLE_NAME if SINGLE_NAME in visible else None
    files: tuple[str, ...] = ()
    entries: dict[str, str] = {}
    if read is not None:
        try:
            with open_checkpoint(read) as checkpoint:
                files = tuple(os.path.relpath(path, directory) for path in checkpoint.files)
                entries = {name: os.path.relpath(h.path, directory) for name, (h, _) in checkpoint.entries.items()}
        except (MappingError, OSError) as exc:
            raise MappingError(
                f"{directory}: holds files that are not a checkpoint weightmap can read, so they are not replaced "
                f"({exc}); remove them or write into another directory"
            ) from exc
    used = set(files)
    return Earlier(
        files=files,
        index=has_index,
        entries=entries,
        stale=tuple(n for n in visible if n not in used and is_checkpoint_name(n)),
        parked=tuple(n for n in names if n not in used and _PARKED_NAME.fullmatch(n)),
        foreign=tuple(n for n in visible if n not in used and not is_checkpoint_name(n)),
    )


def checkpoint_to_replace(directory: Path, *, lone: bool) -> Earlier:
    """:func:`earlier_checkpoint`, refused (:class:`MappingError`) where the new checkpoint cannot replace it.

    ``lone``: the new checkpoint is a single ``model.safetensors`` without an index. Refused:
    another visible ``*.safetensors`` in a directory without an index, or beside a new lone
    file (see the module docstring).
    """
    earlier = earlier_checkpoint(directory)
    if not earlier.foreign:
        return earlier
    names = ", ".join(earlier.foreign)
    rule = (f"convert replaces only a checkpoint: the files {INDEX_NAME} names, {SINGLE_NAME}, "
            "model-NNNNN-of-NNNNN.safetensors")
    if not earlier.index:
        raise MappingError(
            f"{directory}: holds files that are not a checkpoint convert replaces ({names}) and no {INDEX_NAME} "
            f"to tell a checkpoint from them ({rule}); move them away or write into another directory"
        )
    if lone:
        raise MappingError(
            f"{directory}: holds {names} beside its checkpoint; a lone {SINGLE_NAME} written here would leave the "
            f"directory without {INDEX_NAME}, so it would not read as one checkpoint ({rule}). Move them away, "
            "write into another directory, or give a maximum shard size that makes shards"
        )
    return earlier


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


def _needs_parking(earlier: Earlier, new_names: set[str], sharded: bool) -> bool:
    if not earlier.files:
        return False
    if sharded:
        return not earlier.index or bool(new_names & set(earlier.files))
    return earlier.index or earlier.files != (SINGLE_NAME,)


def _parked_name(name: str) -> str:
    return f".{Path(name).name[:_NAME_PART]}.{secrets.token_hex(8)}{_PARKED}"


class _Transaction:
    """One replacement in progress: what was changed so far, so that it can be put back."""

    def __init__(self, directory: Path, dir_fd: int, earlier: Earlier) -> None:
        self.directory = directory
        self.dir_fd = dir_fd
        self.earlier = earlier
        self.aside: dict[str, str] = {}  # stale visible name -> hidden name
        self.parked: dict[str, str] = {}  # visible name -> hidden name
        self.parked_index: str | None = None  # the earlier index's hidden name, while a parked index stands in
        self.index_replaced = False  # the directory's index is (or may be) the parked one
        self.created: list[tuple[str, AtomicFile]] = []  # published under names that were free
        self.names_removed = False

    def _unlink(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.dir_fd)

    def _lstat(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=self.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def _link(self, name: str, new_name: str) -> None:
        """A second name for ``name`` itself (a symlink stays a symlink: never followed)."""
        os.link(name, new_name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd, follow_symlinks=False)

    def _hide(self, name: str, into: dict[str, str]) -> None:
        hidden = _parked_name(name)
        self._link(name, hidden)
        into[name] = hidden

    def set_aside(self) -> None:
        for name in self.earlier.stale:
            self._hide(name, self.aside)
            self._unlink(name)

    def park(self) -> None:
        earlier = self.earlier
        for name in earlier.files:
            self._hide(name, self.parked)
        weight_map = {tensor: self.parked[file] for tensor, file in earlier.entries.items()}
        if earlier.index:
            hidden: dict[str, str] = {}
            self._hide(INDEX_NAME, hidden)
            self.parked_index = hidden[INDEX_NAME]
        self.index_replaced = True
        with AtomicFile(self.directory / INDEX_NAME, follow_symlinks=False) as out:
            out.write(index_document(weight_map, 0))
        self.names_removed = True
        for name in earlier.files:
            self._unlink(name)

    def publish(self, files: Sequence[AtomicFile]) -> None:
        for staged in files:
            name = staged.target.name
            if self._lstat(name) is None:  # a name this replacement creates: the roll-back may remove it
                self.created.append((name, staged))
            staged.publish()

    def commit(self, index: bytes | None) -> None:
        if index is not None:
            with AtomicFile(self.directory / INDEX_NAME, follow_symlinks=False) as out:
                out.write(index)
        else:
            self._unlink(INDEX_NAME)

    def clean(self, keep: set[str]) -> None:
        """Remove the earlier checkpoint's files that the new one does not use (never raises)."""
        stale = {*self.parked.values(), *self.aside.values(), *self.earlier.parked}
        if self.parked_index is not None:
            stale.add(self.parked_index)
        if not self.names_removed:
            stale |= set(self.earlier.files) - keep
        for name in sorted(stale):
            with contextlib.suppress(OSError):
                self._unlink(name)
        with contextlib.suppress(OSError):
            os.fsync(self.dir_fd)

    def roll_back(self) -> None:
        """Put the earlier checkpoint back under its own names and index; never raises.

        Only names this replacement created are removed, and only while they still hold the
        file it put there. Each step is tried on its own: one that fails leaves the directory
        reading as the earlier checkpoint all the same (through the parked names).
        """
        for name, staged in self.created:
            found = self._lstat(name)
            if found is not None and (found.st_dev, found.st_ino) == staged.identity:
                with contextlib.suppress(OSError):
                    self._unlink(name)
        if self._restore(self.parked if self.names_removed else {}) and self._restore_index():
            self._forget(self.parked)
            if self.parked_index is not None:
                self._forget({INDEX_NAME: self.parked_index})
        if self._restore(self.aside):
            self._forget(self.aside)

    def _restore(self, hidden_names: dict[str, str]) -> bool:
        """Give each hidden file its visible name back; False if one could not be."""
        restored = True
        for name, hidden in hidden_names.items():
            try:
                self._link(hidden, name)
            except FileExistsError:
                pass  # not removed yet
            except OSError:
                restored = False
        return restored

    def _restore_index(self) -> bool:
        """Put the earlier index back (or remove the parked one where there was none); False on failure."""
        if not self.index_replaced:
            return True
        try:
            if self.parked_index is not None:
                os.replace(self.parked_index, INDEX_NAME, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
                self.parked_index = None
            else:
                self._unlink(INDEX_NAME)
        except OSError:
            return False
        return True

    def _forget(self, hidden_names: dict[str, str]) -> None:
        for hidden in hidden_names.values():
            with contextlib.suppress(OSError):
                self._unlink(hidden)


def replace_checkpoint(directory: Path, dir_fd: int, files: Sequence[AtomicFile], index: bytes | None) -> None:
    """Make ``files`` (deferred, complete) and ``index`` the checkpoint of ``directory``, as a whole.

    ``files`` are new files whose targets are in ``directory`` (made with
    ``follow_symlinks=False``); ``index`` is the new index's bytes (None for a single
    ``model.safetensors``). ``dir_fd`` is the directory, open and locked
    (:func:`locked_directory`). See the module docstring for what is replaced, the steps
    and what an error or a kill leaves. Raises :class:`MappingError` (the directory holds
    something that cannot be replaced, see :func:`checkpoint_to_replace`) or
    :class:`OSError`, after putting back whatever was changed.
    """
    earlier = checkpoint_to_replace(directory, lone=index is None)
    new_names = {staged.target.name for staged in files}
    transaction = _Transaction(directory, dir_fd, earlier)
    try:
        transaction.set_aside()
        if _needs_parking(earlier, new_names, sharded=index is not None):
            transaction.park()
        transaction.publish(files)
        transaction.commit(index)
    except BaseException:
        transaction.roll_back()
        raise
    transaction.clean(keep=new_names | {INDEX_NAME})
