"""Dropping a weight's host memory once nothing needs it.

Two kinds of storage are released differently:

* storages that :func:`weightmap.map_weights` made are views of a private file
  mapping: ``resize_(0)`` raises on them, but ``madvise(MADV_DONTNEED)`` drops
  their pages from the process at once (the page cache is left alone) and the
  tensor stays valid: its next read faults the pages back in from the file.
  This is always safe, and it is what release does by default;
* ordinary, resizable storages can only be freed with ``resize_(0)``, and that
  is not safe in general: every tensor that views a resized storage still has
  its shape, and reading it is a segmentation fault, not an error. So an
  ordinary storage is resized only when the caller asks for it
  (``resize=True``), promising that no tensor of it is read again (a weight
  already copied into a built engine), and even then never while a second
  tensor views it.
"""

from __future__ import annotations

import logging
import mmap
from collections.abc import Callable

import torch

from weightmap import registry

__all__ = ["release_mapped_storage", "release_storage", "madvise_supported", "is_mapped"]

log = logging.getLogger("weightmap")

StorageLike = torch.UntypedStorage | torch.Tensor | torch.TypedStorage

_use_count: Callable[[int], int] | None = getattr(torch._C, "_storage_Use_Count", None)


def madvise_supported() -> bool:
    """True when this platform's ``mmap`` offers ``madvise(MADV_DONTNEED)``."""
    return hasattr(mmap.mmap, "madvise") and hasattr(mmap, "MADV_DONTNEED")


def _untyped(storage: object) -> torch.UntypedStorage:
    if isinstance(storage, torch.Tensor):
        return storage.untyped_storage()
    if isinstance(storage, torch.TypedStorage):
        return storage._untyped_storage
    if isinstance(storage, torch.UntypedStorage):
        return storage
    kind = type(storage)
    raise TypeError(
        f"release needs a torch.Tensor or a torch storage, not {kind.__module__}.{kind.__qualname__}"
    )


def _inward_pages(offset: int, nbytes: int, page: int) -> tuple[int, int]:
    """The page-aligned range ``[start, end)`` entirely inside ``[offset, offset + nbytes)``."""
    start = -(-offset // page) * page
    end = (offset + nbytes) // page * page
    return start, max(start, end)


def _find(untyped: torch.UntypedStorage) -> tuple[registry.Region, mmap.mmap] | None:
    if untyped.device.type != "cpu":
        return None
    nbytes = untyped.nbytes()
    if nbytes == 0:
        return None
    return registry.find_region(untyped.data_ptr(), nbytes)


def is_mapped(storage: StorageLike) -> bool:
    """True when ``storage`` (or a tensor's storage) lies in a live mapping that :func:`map_weights` made."""
    return _find(_untyped(storage)) is not None


def release_mapped_storage(storage: StorageLike) -> bool:
    """Drop the resident pages of a storage that :func:`map_weights` mapped.

    Returns True when ``storage`` (or a tensor's storage) lies in a live
    mapping of ours: its pages are dropped with ``madvise(MADV_DONTNEED)`` and
    nothing is resized. The tensor stays valid and is re-read from the file the
    next time it is used.

    What happens to in-place writes (``fill_``, ``add_``, an optimizer step):

    * the release is of the whole storage, whatever view is passed: releasing
      ``w[10:20]`` releases every page of ``w``'s storage (each mapped tensor
      has a storage of its own, exactly its bytes in the file);
    * pages entirely inside the storage revert to the file: their in-place
      writes are discarded;
    * the partial pages at each end (shared with the neighbours in the file,
      since safetensors offsets are not page-aligned) are kept, with their
      writes: the range is rounded inward to ``mmap.PAGESIZE``, so a neighbour's
      in-place writes are never lost. A storage smaller than a page (or
      straddling one page boundary without covering a whole page) drops nothing
      and keeps every write, and the result is still True.

    Any other storage is left alone and the result is False: an ordinary
    storage, a meta tensor's (nothing to give back), a storage on another
    device, and every storage where ``madvise`` is unavailable. An argument
    that is neither a tensor nor a storage is a ``TypeError`` naming its type.

    Example::

        mapped = map_weights(model, "model.safetensors")
        release_mapped_storage(model.lm_head.weight)   # True, pages dropped
        release_mapped_storage(torch.ones(3))          # False, untouched
    """
    untyped = _untyped(storage)
    if not madvise_supported():
        return False
    found = _find(untyped)
    if found is None:
        return False
    region, mm = found
    start, end = _inward_pages(untyped.data_ptr() - region.base, untyped.nbytes(), mmap.PAGESIZE)
    if end > start:
        mm.madvise(mmap.MADV_DONTNEED, start, end - start)
    return True


def _views_besides_one(untyped: torch.UntypedStorage) -> int | None:
    """How many tensors view ``untyped`` beyond the one being released (None: torch cannot tell).

    torch counts one reference per tensor that holds the storage plus one for
    the Python storage object, which exists while we hold ``untyped``.
    """
    if _use_count is None:
        return None
    return max(0, _use_count(untyped._cdata) - 2)


def release_storage(storage: StorageLike, *, resize: bool = False) -> bool:
    """Release a weight after its last use; True when its memory was given back.

    A storage of ours (see :func:`release_mapped_storage`) has its pages
    dropped and is not resized: its tensors stay valid and re-read the file.

    Any other storage is kept unless ``resize=True``, and the result is False.
    ``resize=True`` frees an ordinary storage with ``resize_(0)``: the caller
    promises that the tensor is not read again, because torch keeps its shape
    and reading it is a segmentation fault, not an error. Use it for weights
    that were copied into something else (a built engine) and for a model that
    is not run afterwards. Even then the storage is kept (False) while a second
    tensor views it (a slice, ``.data``, a tensor saved for backward): only the
    one tensor passed, or the one tensor a passed storage belongs to, may lose
    its data. A storage that is not resizable (views of ``safetensors``' own
    mapping, of a ``torch.frombuffer`` buffer) is kept too. Each refusal is a
    debug line on the ``weightmap`` logger that says why.

    A meta tensor's storage gives nothing back: False. An argument that is
    neither a tensor nor a storage is a ``TypeError`` naming its type.

    Example::

        release_storage(mapped_model.fc.weight)          # True: pages dropped, tensor still readable
        release_storage(torch.ones(1024))                # False: ordinary storages are kept by default
        engine_copy = weight.clone(); release_storage(weight, resize=True)   # True: resized to 0 bytes
    """
    untyped = _untyped(storage)
    if release_mapped_storage(untyped):
        return True
    where = f"storage at 0x{untyped.data_ptr():x} ({untyped.nbytes()} bytes on {untyped.device})"
    if untyped.device.type == "meta" or untyped.nbytes() == 0:
        return False
    if not resize:
        log.debug("not releasing %s: not mapped by weightmap, and resize=True was not asked for", where)
        return False
    others = _views_besides_one(untyped)
    if others:
        log.debug("not resizing %s: %d more tensor(s) view it and would crash when read", where, others)
        return False
    try:
        untyped.resize_(0)
    except RuntimeError as exc:
        log.debug("not releasing %s: not mapped by weightmap and not resizable (%s)", where, exc)
        return False
    return True
