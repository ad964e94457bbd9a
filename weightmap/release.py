"""Dropping a weight's host memory once nothing needs it.

Two kinds of storage are released differently:

* storages that :func:`weightmap.map_weights` made are views of a private file
  mapping: ``resize_(0)`` raises on them, but ``madvise(MADV_DONTNEED)`` drops
  their pages from the process at once (the page cache is left alone) and the
  tensor stays valid: its next read faults the pages back in from the file;
* ordinary, resizable storages are freed with ``resize_(0)``.
"""

from __future__ import annotations

import logging
import mmap

import torch

from weightmap import registry

__all__ = ["release_mapped_storage", "release_storage", "madvise_supported"]

log = logging.getLogger("weightmap")

StorageLike = torch.UntypedStorage | torch.Tensor | torch.TypedStorage


def madvise_supported() -> bool:
    """True when this platform's ``mmap`` offers ``madvise(MADV_DONTNEED)``."""
    return hasattr(mmap.mmap, "madvise") and hasattr(mmap, "MADV_DONTNEED")


def _untyped(storage: StorageLike) -> torch.UntypedStorage:
    if isinstance(storage, torch.Tensor):
        return storage.untyped_storage()
    if isinstance(storage, torch.TypedStorage):
        return storage._untyped_storage
    return storage


def _inward_pages(offset: int, nbytes: int, page: int) -> tuple[int, int]:
    """The page-aligned range ``[start, end)`` entirely inside ``[offset, offset + nbytes)``."""
    start = -(-offset // page) * page
    end = (offset + nbytes) // page * page
    return start, max(start, end)


def release_mapped_storage(storage: StorageLike) -> bool:
    """Drop the resident pages of a storage that :func:`map_weights` mapped.

    Returns True when ``storage`` (or a tensor's storage) lies in a live
    mapping of ours: its pages are dropped with ``madvise(MADV_DONTNEED)`` and
    nothing is resized. The tensor stays valid and is re-read from the file the
    next time it is used; in-place writes to it are discarded. Only pages that
    lie entirely inside the storage are dropped (the range is rounded inward to
    ``mmap.PAGESIZE``), so a neighbour that shares a boundary page keeps its
    in-place writes.

    Any other storage is left alone and the result is False; so is every
    storage where ``madvise`` is unavailable.

    Example::

        mapped = map_weights(model, "model.safetensors")
        release_mapped_storage(model.lm_head.weight)   # True, pages dropped
        release_mapped_storage(torch.ones(3))          # False, untouched
    """
    if not madvise_supported():
        return False
    untyped = _untyped(storage)
    if untyped.device.type != "cpu":
        return False
    address, nbytes = untyped.data_ptr(), untyped.nbytes()
    if nbytes == 0:
        return False
    found = registry.find_region(address, nbytes)
    if found is None:
        return False
    region, mm = found
    start, end = _inward_pages(address - region.base, nbytes, mmap.PAGESIZE)
    if end > start:
        mm.madvise(mmap.MADV_DONTNEED, start, end - start)
    return True


def release_storage(storage: StorageLike) -> bool:
    """Release a weight after its last use; True when its memory was given back.

    A storage of ours (see :func:`release_mapped_storage`) has its pages
    dropped and is not resized. Any other storage is freed with
    ``resize_(0)``; every tensor that shares it then has no data. A storage that
    is neither ours nor resizable (views of ``safetensors``' own mapping, or of
    a ``torch.frombuffer`` buffer) is left alone: the result is False, and a
    debug log line on the ``weightmap`` logger says why.

    Example::

        release_storage(mapped_model.fc.weight)   # pages dropped, tensor still readable
        release_storage(torch.ones(1024))         # resized to 0 bytes
    """
    untyped = _untyped(storage)
    if release_mapped_storage(untyped):
        return True
    if untyped.nbytes() == 0:
        return False
    try:
        untyped.resize_(0)
    except RuntimeError as exc:
        log.debug(
            "not releasing storage at 0x%x (%d bytes on %s): not mapped by weightmap and not resizable (%s)",
            untyped.data_ptr(),
            untyped.nbytes(),
            untyped.device,
            exc,
        )
        return False
    return True
