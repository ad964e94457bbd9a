"""Writing checkpoints that map well: one entry per tensor, in the dtypes the model runs in."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from weightmap.errors import MappingError
from weightmap.format import check_little_endian
from weightmap.streamwrite import TensorSpec, write_checkpoint
from weightmap.targets import collect_targets, is_exported_program

__all__ = ["save_weights_for_mapping"]


def _tensors_to_save(model: torch.nn.Module | Any) -> dict[str, torch.Tensor]:
    """One tensor per object, under its first name, in the model's order.

    A module contributes its state_dict (non-persistent buffers are not saved:
    no checkpoint holds them); an ExportedProgram its state_dict and its
    constants (lifted constants and non-persistent buffers alike: the program
    needs them all to run).
    """
    targets = collect_targets(model)
    if not is_exported_program(model):
        targets = [t for t in targets if t.persistent]
    return {t.names[0]: t.tensor for t in targets}


def save_weights_for_mapping(model: torch.nn.Module | Any, path: str | os.PathLike[str]) -> Path:
    """Write a model's weights as a safetensors file that :func:`map_weights` maps without a copy.

    One entry per tensor object (a tied weight once, under its first name), in
    the model's current dtypes, ordered so that every offset is a multiple of
    its item size. Use it for checkpoints cast while loading (stored in fp32,
    run in bf16): written once in the dtypes the model runs in, they map
    without a copy from then on. The file loads with
    ``safetensors.torch.load_file`` too. This needs the weights in memory; a
    checkpoint too large for that is rewritten tensor by tensor, without loading
    it, by :func:`weightmap.convert_checkpoint` (``python -m weightmap convert``).

    The file replaces ``path`` in one step: it is written as a new file beside
    it (unnamed, with Linux's ``O_TMPFILE``, where the file system allows), flushed
    to disk and renamed onto ``path``. So a crash, even ``SIGKILL``, never leaves a
    half-written checkpoint under the final name; with ``O_TMPFILE`` it leaves no
    file at all, and without it the hidden ``.<name>.<random>.weightmap-tmp`` a
    killed writer leaves is removed by the next save in that directory. Writing onto
    the file the model is mapped from is safe (existing views keep the old file's
    pages). Replacing a file keeps its permission bits (a 0600 checkpoint stays
    0600), and its owner where allowed; a new file gets 0666 less the umask. When
    ``path`` is a symlink, the file it points to is replaced and the link is kept.
    Returns ``path``.

    Raises :class:`MappingError` naming the tensor when a tensor is still on the
    meta device (there is nothing to write), before anything is written. Failures
    of the system (no space left, a missing or read-only directory) raise
    :class:`OSError` with the system's errno (``FileNotFoundError``,
    ``PermissionError``, ...) whose message and ``filename`` name ``path``, never
    the hidden file, and whatever was at ``path`` is unchanged; a directory at
    ``path`` raises :class:`IsADirectoryError`.

    Example::

        model = MyModel().to(torch.bfloat16)
        model.load_state_dict(load_file("fp32.safetensors"))
        save_weights_for_mapping(model, "bf16.safetensors")
        map_weights(meta_model, "bf16.safetensors", strict=True)   # no copies
    """
    check_little_endian()
    path = Path(path)
    tensors = _tensors_to_save(model)
    on_meta = [name for name, t in tensors.items() if t.device.type == "meta"]
    if on_meta:
        raise MappingError(
            f"{path}: cannot save {on_meta[0]!r}"
            + (f" and {len(on_meta) - 1} more" if len(on_meta) > 1 else "")
            + ": it is on the meta device and has no data; map or load the weights first"
        )
    specs = [TensorSpec(name, t.dtype, tuple(t.shape)) for name, t in tensors.items()]
    write_checkpoint(path, specs, lambda spec: tensors[spec.name].detach())
    return path
