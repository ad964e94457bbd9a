"""The checkpoint a plan measures: one the harness generates, or one a user has (a file, a sharded folder, its index).

:func:`resolve_checkpoint` is what :func:`harness.plan.make_plan` calls, once. With ``checkpoint.generate`` the
checkpoint is one file of ours (:func:`harness.models.checkpoints.ensure_checkpoint`), or, with
``checkpoint.max_shard_size`` too, a folder of shards and their index of ours as transformers saves them
(:func:`harness.models.sharded.ensure_sharded_checkpoint`), recorded as a user's sharded folder is (its files,
bytes and dtypes). Without ``generate``,
``checkpoint.path`` may be what transformers saves and :func:`weightmap.open_checkpoint` resolves:

* a folder holding ``model.safetensors.index.json`` and the shards it names, or exactly one ``*.safetensors``;
* the index file itself (``*.json``);
* one ``.safetensors`` file.

A file that carries the harness's ``generator`` metadata is one of ours and is checked as before (the same names,
shapes and dtypes, and the seed). Any other checkpoint is read from its headers alone and must fit the model as
``load_state_dict(strict=True)`` would take it (:func:`checkpoint_mismatch`): every persistent tensor present
(a tied group once, under any of its names), nothing the model does not take (a non-persistent buffer is never
in a checkpoint), each with the model's shape and dtype. :func:`weightmap.preview_mapping` then decides what
mapping would do, which raises for what no strategy can take (a tie stored twice with different values).

Nothing in a user's checkpoint, nor in its folder, is ever written, renamed or deleted here.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from harness.models.checkpoints import GENERATOR, CheckpointError, ensure_checkpoint
from harness.models.sharded import ensure_sharded_checkpoint
from harness.results.record import CheckpointInfo
from harness.scenario import CheckpointConfig
from weightmap import Checkpoint, HeaderError, MappingError, collect_targets, open_checkpoint, preview_mapping

__all__ = ["SHOWN", "ResolvedCheckpoint", "checkpoint_info", "checkpoint_mismatch", "is_generated_file",
           "resolve_checkpoint"]

SHOWN = 5
"""How many differing tensors an error names before it says how many there are in all."""


@dataclass(frozen=True)
class ResolvedCheckpoint:
    """The checkpoint a plan measures: the ``path`` every strategy is given (the file, folder or index as the
    scenario names it), every file that holds its tensors (``files``, shards in name order), and the record the
    plan and results keep of it (``info``)."""

    path: Path
    files: tuple[Path, ...]
    info: CheckpointInfo


def is_generated_file(path: Path) -> bool:
    """Whether ``path`` is a regular file whose safetensors header carries the harness's ``generator`` metadata
    (a checkpoint of ours, which the harness may replace and keep files beside); False for anything else."""
    if not path.is_file():
        return False
    try:
        checkpoint = open_checkpoint(path)
    except (OSError, ValueError):
        return False
    if checkpoint.files != (path,):  # an index, even of one shard, is no file of ours
        return False
    return (checkpoint.headers[0].metadata or {}).get("generator") == GENERATOR


def checkpoint_info(checkpoint: Checkpoint, *, path: Path, generated: bool, seed: int) -> CheckpointInfo:
    """What the plan and results say of ``checkpoint``: its files, their total bytes (headers included), and the
    bytes of its tensors per dtype (``float32``, ``bfloat16``...), largest first."""
    dtypes: Counter[str] = Counter()
    for header, entry in checkpoint.entries.values():
        del header
        dtypes[str(entry.dtype).removeprefix("torch.")] += entry.nbytes
    return CheckpointInfo(path=str(path), generated=generated, seed=seed,
                          bytes=sum(f.stat().st_size for f in checkpoint.files), files=len(checkpoint.files),
                          dtype_bytes=dict(sorted(dtypes.items(), key=lambda kv: (-kv[1], kv[0]))))


def checkpoint_mismatch(module: nn.Module, checkpoint: Checkpoint) -> str | None:
    """How ``checkpoint`` differs from what ``module`` takes, or None where it fits (see the module docstring).

    One line: how many tensors differ in all, then the first :data:`SHOWN` of them, each as missing (a persistent
    tensor of the model the checkpoint lacks), unexpected (a checkpoint tensor no persistent tensor of the model
    takes), or its shape or dtype in the checkpoint and in the model. Reads the headers only.
    """
    problems: list[str] = []
    taken: set[str] = set()
    for target in collect_targets(module):
        if not target.persistent:
            continue
        held = [name for name in target.names if name in checkpoint.entries]
        if not held:
            problems.append(f"{target.names[0]!r} missing")
            continue
        taken.update(held)
        want_shape, want_dtype = tuple(target.tensor.shape), target.tensor.dtype
        for name in held:
            _, entry = checkpoint.entries[name]
            if tuple(entry.shape) != want_shape:
                problems.append(f"{name!r} has shape {list(entry.shape)}, the model {list(want_shape)}")
            elif entry.dtype != want_dtype:
                problems.append(f"{name!r} is {_dtype(entry.dtype)}, the model {_dtype(want_dtype)}")
    problems += [f"{name!r} unexpected" for name in checkpoint.entries if name not in taken]
    if not problems:
        return None
    more = f"; and {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""
    count = f"{len(problems)} tensor{'s' if len(problems) != 1 else ''}"
    return f"does not fit the model: {count} differ: {'; '.join(problems[:SHOWN])}{more}"


def _dtype(dtype: object) -> str:
    return str(dtype).removeprefix("torch.")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def resolve_checkpoint(module: nn.Module, config: CheckpointConfig, where: Callable[[str], str], *,
                       progress: bool = True) -> ResolvedCheckpoint:
    """The checkpoint ``config`` names, made sure of for ``module`` (see the module docstring).

    Raises :class:`~harness.models.checkpoints.CheckpointError` in one line that starts with
    ``where('checkpoint.path')`` and names the checkpoint, for: a generated file or folder of shards that cannot be
    reused or written (:func:`~harness.models.checkpoints.ensure_checkpoint`,
    :func:`~harness.models.sharded.ensure_sharded_checkpoint`); a path that is missing, unreadable, not safetensors, a
    folder with no safetensors file or several and no index, an index naming a shard that is missing; a checkpoint
    that does not fit the model (:func:`checkpoint_mismatch`) or that mapping refuses. Writes nothing but a
    generated checkpoint.
    """
    try:
        return _resolve(module, config, progress)
    except CheckpointError as exc:
        raise CheckpointError(f"{where('checkpoint.path')}: {_one_line(str(exc))}") from exc


def _resolve(module: nn.Module, config: CheckpointConfig, progress: bool) -> ResolvedCheckpoint:
    """The checkpoint ``config`` names: generated or reused where it is (or is to be) one of ours, else the user's,
    checked against ``module``; its files opened once, for the record."""
    path, generated = config.path, False
    ours = config.max_shard_bytes is not None or config.generate or is_generated_file(path) \
        or not os.path.lexists(path)
    if config.max_shard_bytes is not None:  # only with generate (the scenario's rule)
        path, generated = ensure_sharded_checkpoint(module, path, config.seed, config.max_shard_bytes,
                                                    progress=progress)
    elif ours:
        path, generated = ensure_checkpoint(module, path, config.seed, generate=config.generate, progress=progress)
    try:
        checkpoint = open_checkpoint(path)
    except (MappingError, HeaderError, OSError) as exc:
        raise CheckpointError(_one_line(str(exc))) from exc
    if not ours:
        _check_fits(module, path, checkpoint)
    return ResolvedCheckpoint(path, checkpoint.files,
                              checkpoint_info(checkpoint, path=path, generated=generated, seed=config.seed))


def _check_fits(module: nn.Module, path: Path, checkpoint: Checkpoint) -> None:
    """:class:`~harness.models.checkpoints.CheckpointError` where the user's ``checkpoint`` at ``path`` does not fit
    ``module`` (:func:`checkpoint_mismatch`) or mapping it is refused (:func:`weightmap.preview_mapping`)."""
    problem = checkpoint_mismatch(module, checkpoint)
    if problem:
        raise CheckpointError(f"{path}: {problem}")
    try:
        preview_mapping(module, path)
    except (MappingError, HeaderError, OSError) as exc:
        raise CheckpointError(_one_line(str(exc))) from exc
