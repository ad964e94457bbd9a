"""Tensors that share one storage with different views, and comparing values held twice.

A *storage tie* of different views (``proj_t = nn.Parameter(proj.weight.data.t())``, a
slice, a flat view) is several targets of :mod:`weightmap.targets` on one storage; the same
view under two names is one target already. :func:`storage_groups` finds the former, on the
meta device as on the CPU. :class:`Geometry` is how a view sits in its storage, and
:func:`equal_in_chunks` compares two tensors bit for bit a bounded piece at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

__all__ = ["CHUNK_BYTES", "Geometry", "bits", "covers_storage", "disjoint", "equal_in_chunks", "storage_groups"]

CHUNK_BYTES = 16 * 2**20  # the most bytes of each side compared at once

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(dtype: torch.dtype) -> torch.dtype:
    """An integer dtype of ``dtype``'s item size: comparing in it compares bits (NaN equals NaN, -0 is not 0)."""
    return _BITS[dtype.itemsize]


@dataclass(frozen=True)
class Geometry:
    """Where a view sits in its storage: shape, strides and offset, in items."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int

    @classmethod
    def of(cls, tensor: torch.Tensor) -> Geometry:
        return cls(tuple(tensor.shape), tuple(tensor.stride()), int(tensor.storage_offset()))

    def on(self, base: torch.Tensor) -> torch.Tensor:
        """This view of ``base``'s storage (``base`` covers that storage from its first item)."""
        return base.as_strided(self.shape, self.stride, self.offset)

    def __str__(self) -> str:
        return f"shape {list(self.shape)}, strides {list(self.stride)}, offset {self.offset}"


def covers_storage(tensor: torch.Tensor) -> bool:
    """True when the tensor is its whole storage, in order: contiguous, from its first byte to its last."""
    return (
        tensor.storage_offset() == 0
        and tensor.is_contiguous()
        and tensor.numel() * tensor.element_size() == tensor.untyped_storage().nbytes()
    )


def _extent(tensor: torch.Tensor) -> tuple[int, int]:
    """The items of its storage a view spans, first to last: ``[start, end)``."""
    start = int(tensor.storage_offset())
    last = start + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True))
    return start, last + 1


def disjoint(tensors: Sequence[torch.Tensor]) -> bool:
    """True when no two of the views span a common item of their storage (one storage, one dtype)."""
    spans = sorted(_extent(t) for t in tensors)
    return all(end <= start for (_, end), (start, _) in zip(spans, spans[1:], strict=False))


def _storage_id(tensor: torch.Tensor) -> int | None:
    try:
        if tensor.numel() == 0 or tensor.layout != torch.strided or tensor.is_nested:
            return None
        return int(tensor.untyped_storage()._cdata)
    except (RuntimeError, ValueError, NotImplementedError, TypeError, AttributeError):
        return None


def storage_groups(tensors: Sequence[torch.Tensor]) -> list[list[int]]:
    """Indices of the tensors that share a storage, in groups of two or more, in order."""
    groups: dict[int, list[int]] = {}
    for i, tensor in enumerate(tensors):
        key = _storage_id(tensor)
        if key is not None:
            groups.setdefault(key, []).append(i)
    return [group for group in groups.values() if len(group) > 1]


def _pieces(a: torch.Tensor, b: torch.Tensor, limit: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    if a.dim() == 0 or a.numel() * a.element_size() <= limit:
        yield a, b
        return
    row = a[0].numel() * a.element_size()
    if row > limit:  # one row is over the limit: compare row by row, each in pieces
        for i in range(a.shape[0]):
            yield from _pieces(a[i], b[i], limit)
        return
    step = max(1, limit // max(row, 1))
    for i in range(0, a.shape[0], step):
        yield a[i : i + step], b[i : i + step]


def equal_in_chunks(a: torch.Tensor, b: torch.Tensor, limit: int = CHUNK_BYTES) -> bool:
    """True when two tensors of one shape and dtype hold the same values, compared ``limit`` bytes at a time.

    Either may be any strided view; the memory the comparison takes is about ``limit`` / item size.
    """
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return all(torch.equal(x, y) for x, y in _pieces(a, b, limit))
