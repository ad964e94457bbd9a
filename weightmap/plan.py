"""Releasing each weight right after the last partition that reads it.

A builder that compiles a model partition by partition (one engine each)
knows, before it starts, which tensors each partition reads. :class:`ReleasePlan`
turns that into "release this storage after partition i" and does the
releasing as partitions are reported built, in order::

    plan = ReleasePlan.from_names(model, [["embed.weight", "layers.0.w"],
                                          ["layers.1.w", "embed.weight"]])
    for i, part in enumerate(parts):
        build_engine(part)
        plan.built(i)        # releases what no later partition reads

A storage read by several partitions (a tied weight, or one reused by unrolled
steps) is released once, after the last of them. Storages are keyed by
identity, so two names of one tied tensor count as one weight.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from weightmap.release import release_storage
from weightmap.targets import collect_targets

__all__ = ["ReleasePlan", "ReleaseStep"]


@dataclass(frozen=True)
class ReleaseStep:
    """What one :meth:`ReleasePlan.built` call released."""

    index: int
    released: int  # storages whose memory was given back
    released_bytes: int
    kept: int  # storages whose last use this was, but that could not be released
    kept_bytes: int


@dataclass
class _Weight:
    storage: torch.UntypedStorage
    nbytes: int
    last: int


def _storage_key(tensor: torch.Tensor) -> tuple[str, int, int] | None:
    storage = tensor.untyped_storage()
    if tensor.device.type == "meta" or storage.nbytes() == 0:
        return None
    return (str(storage.device), storage.data_ptr(), storage.nbytes())


@dataclass
class ReleasePlan:
    """Release each storage after the last partition (in build order) that reads it.

    Build it with :meth:`from_tensors` or :meth:`from_names`, then call
    :meth:`built` with 0, 1, 2, ... as each partition is built. ``release`` is
    the function that frees one storage (default :func:`release_storage`:
    mapped weights have their pages dropped, ordinary ones are resized to 0).
    """

    partitions: int
    release: Callable[[torch.UntypedStorage], bool] = release_storage
    _weights: dict[tuple[str, int, int], _Weight] = field(default_factory=dict)
    _next: int = 0

    @classmethod
    def from_tensors(
        cls,
        partitions: Sequence[Iterable[torch.Tensor]],
        *,
        release: Callable[[torch.UntypedStorage], bool] = release_storage,
    ) -> ReleasePlan:
        """A plan from the tensors each partition reads, partitions in build order."""
        plan = cls(len(partitions), release)
        for index, tensors in enumerate(partitions):
            for tensor in tensors:
                key = _storage_key(tensor)
                if key is None:
                    continue
                weight = plan._weights.get(key)
                if weight is None:
                    plan._weights[key] = _Weight(tensor.untyped_storage(), key[2], index)
                else:
                    weight.last = max(weight.last, index)
        return plan

    @classmethod
    def from_names(
        cls,
        model: torch.nn.Module | Any,
        partitions: Sequence[Iterable[str]],
        *,
        release: Callable[[torch.UntypedStorage], bool] = release_storage,
    ) -> ReleasePlan:
        """A plan from the names (state_dict or buffer names) each partition reads.

        ``model`` is a module or an ExportedProgram. An unknown name is a
        ``KeyError`` that names it.
        """
        by_name = {name: t.tensor for t in collect_targets(model) for name in t.names}
        resolved = []
        for index, names in enumerate(partitions):
            tensors = []
            for name in names:
                if name not in by_name:
                    raise KeyError(f"partition {index} reads {name!r}, which the model does not have")
                tensors.append(by_name[name])
            resolved.append(tensors)
        return cls.from_tensors(resolved, release=release)

    def last_use(self, tensor: torch.Tensor) -> int | None:
        """The index of the last partition that reads ``tensor`` (None if none does)."""
        key = _storage_key(tensor)
        weight = self._weights.get(key) if key else None
        return weight.last if weight else None

    @property
    def pending_bytes(self) -> int:
        """Bytes of the storages not released yet."""
        return sum(w.nbytes for w in self._weights.values() if w.last >= self._next)

    def built(self, index: int) -> ReleaseStep:
        """Partition ``index`` is built: release every storage it was the last reader of.

        Partitions must be reported in order, each once (0, 1, 2, ...): a
        ``ValueError`` otherwise, since releasing out of order could free a
        weight that an earlier partition still has to read.
        """
        if index != self._next:
            raise ValueError(f"partition {index} reported built, but partition {self._next} is next")
        if index >= self.partitions:
            raise ValueError(f"partition {index} reported built, but the plan has {self.partitions}")
        self._next += 1
        released = released_bytes = kept = kept_bytes = 0
        for weight in self._weights.values():
            if weight.last != index:
                continue
            if self.release(weight.storage):
                released, released_bytes = released + 1, released_bytes + weight.nbytes
            else:
                kept, kept_bytes = kept + 1, kept_bytes + weight.nbytes
        return ReleaseStep(index, released, released_bytes, kept, kept_bytes)
