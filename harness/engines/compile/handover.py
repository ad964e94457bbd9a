"""Handing a partition's tensors to a compiler that views them with numpy, and letting its engine file go.

OpenVINO's ``convert_model`` and iree-turbine's importer view the tensors they are given with numpy,
which makes a storage unresizable for good: ``load``'s weights could then never be released.
:func:`aliased` hands them :func:`alias` es instead, tensors over the same memory whose storages are
new ones that do not own it. :func:`drop_behind` flushes a written engine file and drops its pages
from the page cache, so that an engine let go holds no memory of the run's.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["alias", "aliased"]


def alias(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor over ``tensor``'s memory (same dtype, shape, strides and offset) whose storage is a new one that
    does not own that memory: what is done to it (numpy's view, which makes a storage unresizable for good) leaves
    ``tensor``'s storage as it was. It must not outlive ``tensor``'s storage. A parameter stays a parameter; a
    tensor with no bytes, or off the CPU, is returned as it is."""
    storage = tensor.untyped_storage()
    if tensor.device.type != "cpu" or not storage.nbytes():
        return tensor
    window = (ctypes.c_char * storage.nbytes()).from_address(storage.data_ptr())
    own = torch.frombuffer(window, dtype=torch.uint8).untyped_storage()
    view = torch.empty(0, dtype=tensor.dtype).set_(own, tensor.storage_offset(), tensor.shape, tensor.stride())
    return torch.nn.Parameter(view, requires_grad=False) if isinstance(tensor, torch.nn.Parameter) else view


@contextlib.contextmanager
def aliased(program: Any, mark: Callable[[str, torch.Tensor], None] | None = None) -> Iterator[None]:
    """While the block runs, the ``ExportedProgram``'s weights and constants are :func:`alias` es of its tensors
    (``mark(name, alias)`` is called on each, where given); its tables are restored afterwards."""
    tables = [program.state_dict, program.constants]
    saved = [dict(table) for table in tables]
    for table in tables:
        for name, value in table.items():
            if isinstance(value, torch.Tensor):
                table[name] = handed = alias(value)
                if mark is not None:
                    mark(name, handed)
    try:
        yield
    finally:
        for table, before in zip(tables, saved, strict=True):
            table.clear()
            table.update(before)
