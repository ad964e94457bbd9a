"""Generated checkpoints written as transformers' ``save_pretrained(max_shard_size=...)`` writes them.

A folder of shards ``model-00001-of-0000N.safetensors`` ... and ``model.safetensors.index.json``
(``{"metadata": {"total_size": ...}, "weight_map": {name: file}}``), or one ``model.safetensors`` when
everything fits in one shard (transformers then writes no index). Tensors are the ones
:func:`~harness.models.checkpoints.checkpoint_specs` lists (a tied group once, under its first state-dict name),
split in state-dict order as huggingface_hub's ``split_torch_state_dict_into_shards`` splits them
(:func:`shard_groups`), with the same seeded values as the one-file checkpoint of the same seed
(:class:`~harness.models.checkpoints.SeededFill`: values depend on the seed and each tensor's name, dtype and
shape only). Each shard carries :func:`~harness.models.checkpoints.checkpoint_metadata`, so the folder is
recognised as the harness's own.

:func:`ensure_sharded_checkpoint` reuses a folder that holds exactly this checkpoint, replaces one that holds only
files of ours (another model, another seed, a write that was killed), and refuses a folder holding anything else:
a user's file is never deleted nor written beside. Each shard is written to a temporary name, fsynced and renamed
(:func:`weightmap.write_checkpoint`); the index last, so a folder whose write was killed has no index and is never
taken for a finished checkpoint.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

from torch import nn

from harness.fileio.atomic import write_atomic
from harness.models.checkpoints import (
    GENERATOR,
    CheckpointError,
    SeededFill,
    check_room,
    checkpoint_matches,
    checkpoint_metadata,
    checkpoint_specs,
    describe_specs,
    file_bytes,
)
from harness.progress import byte_bar
from harness.scenario import checkpoint_path_problem
from weightmap import TensorSpec, read_header, write_checkpoint

__all__ = ["INDEX_NAME", "SINGLE_NAME", "ensure_sharded_checkpoint", "shard_groups", "shard_names"]

INDEX_NAME = "model.safetensors.index.json"
"""transformers' name of a sharded checkpoint's index."""

SINGLE_NAME = "model.safetensors"
"""transformers' name of a checkpoint that fits in one shard."""

_SHARD = re.compile(r"model-[0-9]{5}-of-[0-9]{5}\.safetensors")
_LEFTOVER = re.compile(r"\.model[-.].*")
"""A hidden temporary file a killed write of a shard or of the index left (``.model-00001-of-00004.safetensors.…``)."""


def _nbytes(spec: TensorSpec) -> int:
    return describe_specs([spec])["nbytes"]


def shard_groups(specs: Sequence[TensorSpec], max_shard_bytes: int) -> list[list[TensorSpec]]:
    """``specs`` split into shards in their order, as huggingface_hub splits a state dict for ``save_pretrained``:
    a new shard whenever the next tensor would take the current one past ``max_shard_bytes``; a tensor larger
    than that gets a shard of its own, placed where it comes while the current shard goes on filling."""
    groups: list[list[TensorSpec]] = []
    current: list[TensorSpec] = []
    size = 0
    for spec in specs:
        nbytes = _nbytes(spec)
        if nbytes > max_shard_bytes:
            groups.append([spec])
            continue
        if current and size + nbytes > max_shard_bytes:
            groups.append(current)
            current, size = [], 0
        current.append(spec)
        size += nbytes
    if current or not groups:
        groups.append(current)
    return groups


def shard_names(count: int) -> list[str]:
    """The file names of ``count`` shards: ``model.safetensors`` alone, else ``model-00001-of-0000N.safetensors``..."""
    if count == 1:
        return [SINGLE_NAME]
    return [f"model-{number:05d}-of-{count:05d}.safetensors" for number in range(1, count + 1)]


def _index(names: Sequence[str], groups: Sequence[Sequence[TensorSpec]]) -> dict[str, object]:
    weight_map = {spec.name: name for name, group in zip(names, groups, strict=True) for spec in group}
    total = sum(_nbytes(spec) for group in groups for spec in group)
    return {"metadata": {"total_size": total}, "weight_map": weight_map}


def _finished(folder: Path, names: Sequence[str], groups: Sequence[Sequence[TensorSpec]], seed: int) -> bool:
    """Whether ``folder`` holds exactly this checkpoint: every shard matching, the index as written (read only)."""
    try:
        present = {entry.name for entry in os.scandir(folder)}
    except OSError:
        return False
    expected = set(names) | ({INDEX_NAME} if len(names) > 1 else set())
    if present != expected:
        return False
    if len(names) > 1:
        try:
            if json.loads((folder / INDEX_NAME).read_text(encoding="utf-8")) != _index(names, groups):
                return False
        except (OSError, ValueError):
            return False
    return all(checkpoint_matches(folder / name, group, seed) for name, group in zip(names, groups, strict=True))


def _ours(path: Path) -> bool:
    """Whether ``path`` is a file this module (or a killed run of it) wrote: a safetensors file with the harness's
    ``generator`` metadata, an index naming only such files, or a hidden temporary file of either."""
    if not path.is_file() or path.is_symlink():
        return False
    if _LEFTOVER.fullmatch(path.name):
        return True
    if path.name == INDEX_NAME:
        try:
            files = set(json.loads(path.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return False
        return bool(files) and all(isinstance(f, str) and _ours_shard(path.parent / f) for f in files)
    return _ours_shard(path)


def _ours_shard(path: Path) -> bool:
    if not (path.name == SINGLE_NAME or _SHARD.fullmatch(path.name)) or path.is_symlink() or not path.is_file():
        return False
    try:
        metadata = read_header(path).metadata or {}
    except (OSError, ValueError):
        return False
    return metadata.get("generator") == GENERATOR


def _stale_files(folder: Path) -> list[Path]:
    """The files of ours in ``folder``, the index first; :class:`CheckpointError` naming the others if any."""
    if not folder.exists():
        return []
    entries = sorted(folder.iterdir())
    foreign = [entry.name for entry in entries if not _ours(entry)]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise CheckpointError(
            f"{folder}: holds files the harness did not write ({shown}: no generator={GENERATOR!r} metadata, or not "
            "a checkpoint file); nothing was deleted. Move them away or set checkpoint.path to another folder")
    return sorted(entries, key=lambda entry: entry.name != INDEX_NAME)


def ensure_sharded_checkpoint(module: nn.Module, folder: str | os.PathLike[str], seed: int, max_shard_bytes: int,
                              *, progress: bool = True) -> tuple[Path, bool]:
    """Make sure ``folder`` holds the sharded checkpoint of ``module`` for ``seed``; returns ``(folder, generated)``.

    Reused untouched (``generated`` False) when it holds exactly the shards and index this would write, each
    shard's header matching (names, dtypes, shapes, metadata and seed). Otherwise, once the whole checkpoint is
    known to fit on the disk (counting the stale files of ours as free) and its largest tensor in memory
    (:func:`~harness.models.checkpoints.check_room`), the files of ours are deleted (the index first) and the
    checkpoint written: each shard to a temporary name, fsynced, renamed; the index last. Progress: one bar over
    all shards' tensor bytes. :class:`CheckpointError` naming the folder, with nothing deleted nor written, when
    it is not a folder or holds any file the harness did not write.
    """
    target = Path(folder)
    problem = checkpoint_path_problem(target, sharded=True)  # stat only
    if problem:
        raise CheckpointError(problem)
    specs = checkpoint_specs(module)
    groups = shard_groups(specs, max_shard_bytes)
    names = shard_names(len(groups))
    if _finished(target, names, groups, seed):
        return target, False
    stale = _stale_files(target)
    metadata = checkpoint_metadata(seed)
    index = json.dumps(_index(names, groups), indent=2) + "\n" if len(groups) > 1 else None
    sizes = describe_specs(specs)
    check_room(target, needed=sum(file_bytes(group, metadata) for group in groups) + len(index or ""),
               stale=sum(path.stat().st_size for path in stale), largest=sizes["largest"])
    for path in stale:  # the index first: from here on the folder is no finished checkpoint
        path.unlink()
    target.mkdir(parents=True, exist_ok=True)
    with SeededFill(seed, reuse_buffer=True) as fill:
        fill.reserve(sizes["largest"])  # the one buffer every tensor is filled in, before the bar starts
        with byte_bar(f"generating {target.name} ({len(groups)} files)", sizes["nbytes"], enabled=progress) as bar:
            for name, group in zip(names, groups, strict=True):
                write_checkpoint(target / name, group, fill, metadata=metadata, progress=bar.update)
    if index is not None:
        write_atomic(target / INDEX_NAME, index)  # last: only now is the folder a finished checkpoint
    return target, True
