"""Releasing each weight as soon as no partition being built needs it.

A builder that compiles a model partition by partition (one engine each)
knows, before it starts, which tensors each partition reads. :class:`ReleasePlan`
turns that into "release this storage after partition i" and does the
releasing as partitions are reported built, in order::

    plan = ReleasePlan.from_names(model, [["embed.weight", "layers.0.w"],
                                          ["layers.1.w", "embed.weight"]])
    for i, part in enumerate(parts):
        build_engine(part)
        plan.built(i)        # drops what partition i read

Storages are keyed by identity, so two names of one tied tensor count as one
weight. When a storage is released depends on its kind:

* a mapped storage (made by :func:`weightmap.map_weights`) has its pages
  dropped after *every* partition that reads it: pages re-read from the file
  are as good as pages kept, so a tied embedding read by the first and the
  last engine is not resident in between. ``reread=False`` keeps a mapped
  storage until its last reader, for callers that write weights in place
  (a drop discards in-place writes, see :func:`weightmap.release_mapped_storage`);
* an ordinary storage is released once, after its last reader, and only with
  ``resize=True``: it can only be freed with ``resize_(0)``, after which its
  tensor must never be read again (see :func:`weightmap.release_storage`).
  By default ordinary storages are kept and counted in ``kept``.

A plan made with ``prefetch=`` (one of :data:`weightmap.PREFETCH_METHODS`)
also warms the page cache for the partitions about to be built, on a
background thread: "partition i is built" is also "partition i + 1 is next".
Prefetch changes what is in the page cache, never what is released, and
brings no page into the process (its RSS does not rise)::

    plan = ReleasePlan.from_names(model, names, prefetch="madvise")
    plan.prefetch(0)          # partitions 0 and 1 start warming
    for i, part in enumerate(parts):
        build_engine(part)    # meanwhile the disk reads partition i + 1
        plan.built(i)         # releases, then warms partition i + 2
    plan.close()
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from weightmap.prefetch import (
    CHUNK_BYTES,
    FileRange,
    Prefetcher,
    PrefetchMethod,
    PrefetchStats,
    evict_ranges,
    file_ranges,
)
from weightmap.release import is_mapped, release_mapped_storage, release_storage
from weightmap.targets import collect_targets

__all__ = ["ReleasePlan", "ReleaseStep"]

log = logging.getLogger("weightmap")


@dataclass(frozen=True)
class ReleaseStep:
    """What one :meth:`ReleasePlan.built` call did.

    ``released``/``released_bytes``: storages whose last reader this partition
    was and whose memory was given back (mapped: pages dropped; ordinary:
    resized to 0). Each storage is counted here once in a whole plan.

    ``dropped``/``dropped_bytes``: mapped storages that a later partition reads
    again, whose pages were dropped now all the same; that partition faults
    them back in from the file (from the page cache, when they are still
    there). A storage is counted here once per partition that drops it.

    ``kept``/``kept_bytes``: storages whose last reader this was but that were
    not released: ordinary storages without ``resize=True``, storages another
    tensor still views, storages that are neither mapped nor resizable.
    """

    index: int
    released: int
    released_bytes: int
    kept: int
    kept_bytes: int
    dropped: int = 0
    dropped_bytes: int = 0


@dataclass
class _Weight:
    storage: torch.UntypedStorage | None  # None once its last reader is built: the plan lets go
    nbytes: int
    mapped: bool
    readers: list[int]

    @property
    def last(self) -> int:
        return self.readers[-1]


def _storage_key(tensor: torch.Tensor) -> tuple[str, int, int] | None:
    if not isinstance(tensor, torch.Tensor):
        kind = type(tensor)
        raise TypeError(f"a release plan needs tensors, not {kind.__module__}.{kind.__qualname__}")
    storage = tensor.untyped_storage()
    if tensor.device.type == "meta" or storage.nbytes() == 0:
        return None
    return (str(storage.device), storage.data_ptr(), storage.nbytes())


class ReleasePlan:
    """Release each storage as soon as no partition still to be built needs it.

    Build it with :meth:`from_tensors` or :meth:`from_names`, then call
    :meth:`built` with 0, 1, 2, ... as each partition is built. The plan only
    releases; it never reads a weight (not even for ``repr()``).

    Options (keywords of both constructors):

    * ``resize`` (default False): also free ordinary storages, with
      ``resize_(0)``, after their last reader. Only for a model that is not run
      afterwards: a resized tensor keeps its shape and reading it is a
      segmentation fault. A storage that another tensor views is kept anyway.
    * ``reread`` (default True): drop a mapped storage's pages after every
      partition that reads it, not only after the last. Turn it off when the
      model's mapped weights are written in place and a later partition must
      see those writes.
    * ``prefetch`` (default None): a method of :data:`weightmap.PREFETCH_METHODS`
      to warm the page cache with, on a background thread that :meth:`close`
      stops. While partition i builds, partitions i + 1 .. i + ``prefetch_ahead``
      (default 1) are warmed, so the disk reads the next partition while this
      one is built: :meth:`prefetch` (call it for partition 0) asks for
      partitions 0 .. ``prefetch_ahead``, and each :meth:`built` asks for the
      one that comes into that window. ``prefetch_ahead=0`` warms only the
      partition being built, from its start: measured here, that overlaps
      nothing and gains nothing. Each partition ahead costs page cache (the
      machine's memory, reclaimable), never the process's RSS.
    * ``prefetch_readers`` (default 1) and ``prefetch_request_bytes`` (default
      :data:`weightmap.prefetch.CHUNK_BYTES`): how many warming threads ask at
      once, and the bytes of each request (see :class:`weightmap.Prefetcher`):
      size them to the disk, e.g. from a sweep of reader threads and request
      sizes over a cold file. They change how fast pages come in, never what
      is warmed or released.
    * ``drop_cache`` (default False): after a mapped storage's last reader,
      also drop its pages from the page cache (``POSIX_FADV_DONTNEED`` on the
      pages entirely inside it), so the run's page cache stays near one
      partition instead of growing to the whole checkpoint. It evicts for
      every process: another process reading the same checkpoint reads those
      pages from the disk again (pages it has mapped are kept). With
      ``prefetch=`` it runs on a thread of the prefetcher's own beside the
      warming one, since the kernel can make the call wait while reads are in
      flight (on the caller's thread it cost 0.25 s per partition here), and
      in line with the warming it would delay the pages asked for next. Measured with ``benchmarks/prefetch.py``
      (cold 2 GiB, 8 partitions): without prefetch it cut the build to 0.59 to
      0.91 of the time, for reasons not pinned down on this virtual machine
      (the page cache reusing the pages just freed instead of growing); with
      prefetch it changed little (0.98 to 1.01 of prefetch alone).
    """

    def __init__(self, partitions: Sequence[Iterable[torch.Tensor]], *, resize: bool = False,
                 reread: bool = True, prefetch: PrefetchMethod | None = None, prefetch_ahead: int = 1,
                 drop_cache: bool = False, prefetch_readers: int = 1,
                 prefetch_request_bytes: int = CHUNK_BYTES) -> None:
        if prefetch_ahead < 0:
            raise ValueError(f"prefetch_ahead={prefetch_ahead}: must be 0 or more")
        self.partitions = len(partitions)
        self.resize = resize
        self.reread = reread
        self.prefetch_ahead = prefetch_ahead
        self.drop_cache = drop_cache
        self._prefetcher = (Prefetcher(prefetch, request_bytes=prefetch_request_bytes, readers=prefetch_readers)
                            if prefetch is not None else None)
        if self._prefetcher is not None:  # a plan dropped without close() stops its thread too
            weakref.finalize(self, self._prefetcher.shutdown)
        self._warmed = -1  # the last partition handed to the prefetcher
        self._next = 0
        self._weights: dict[tuple[str, int, int], _Weight] = {}
        self._by_partition: list[list[_Weight]] = []
        for index, tensors in enumerate(partitions):
            reads: list[_Weight] = []
            for tensor in tensors:
                key = _storage_key(tensor)
                if key is None:
                    continue
                weight = self._weights.get(key)
                if weight is None:
                    storage = tensor.untyped_storage()
                    weight = self._weights[key] = _Weight(storage, key[2], is_mapped(storage), [])
                if not weight.readers or weight.readers[-1] != index:
                    weight.readers.append(index)
                    reads.append(weight)
            self._by_partition.append(reads)
        self._ranges: list[list[FileRange]] = [
            file_ranges(w.storage for w in reads if w.mapped and w.storage is not None) for reads in self._by_partition
        ]

    @classmethod
    def from_tensors(cls, partitions: Sequence[Iterable[torch.Tensor]], *, resize: bool = False,
                     reread: bool = True, prefetch: PrefetchMethod | None = None,
                     prefetch_ahead: int = 1, drop_cache: bool = False, prefetch_readers: int = 1,
                     prefetch_request_bytes: int = CHUNK_BYTES) -> ReleasePlan:
        """A plan from the tensors each partition reads, partitions in build order.

        Meta tensors and empty ones are ignored (nothing to release).

        Example::

            plan = ReleasePlan.from_tensors([[model.embed.weight], [model.head.weight]])
        """
        return cls(partitions, resize=resize, reread=reread, prefetch=prefetch, prefetch_ahead=prefetch_ahead,
                   drop_cache=drop_cache, prefetch_readers=prefetch_readers,
                   prefetch_request_bytes=prefetch_request_bytes)

    @classmethod
    def from_names(cls, model: torch.nn.Module | Any, partitions: Sequence[Iterable[str]], *,
                   resize: bool = False, reread: bool = True, prefetch: PrefetchMethod | None = None,
                   prefetch_ahead: int = 1, drop_cache: bool = False, prefetch_readers: int = 1,
                   prefetch_request_bytes: int = CHUNK_BYTES) -> ReleasePlan:
        """A plan from the names (state_dict or buffer names) each partition reads.

        ``model`` is a module or an ExportedProgram. An unknown name is a
        ``KeyError`` that names it and its partition.

        Example::

            plan = ReleasePlan.from_names(model, [["embed.weight"], ["head.weight"]])
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
        return cls(resolved, resize=resize, reread=reread, prefetch=prefetch, prefetch_ahead=prefetch_ahead,
                   drop_cache=drop_cache, prefetch_readers=prefetch_readers,
                   prefetch_request_bytes=prefetch_request_bytes)

    def __repr__(self) -> str:
        method = self._prefetcher.method if self._prefetcher is not None else None
        readers = f", prefetch_readers={self._prefetcher.readers}" if self._prefetcher is not None else ""
        return (
            f"ReleasePlan(partitions={self.partitions}, next={self._next}, storages={len(self._weights)}, "
            f"pending_bytes={self.pending_bytes}, resize={self.resize}, reread={self.reread}, "
            f"prefetch={method!r}{readers}, drop_cache={self.drop_cache})"
        )

    def prefetch(self, index: int) -> int:
        """Start warming the page cache for partitions ``index`` .. ``index + prefetch_ahead``; returns at once.

        Only mapped storages are warmed, from the file: nothing is faulted into
        the process. Partitions already handed over are not asked for twice.
        Returns the bytes newly asked for. A plan made without ``prefetch=``
        raises ``ValueError``. Call it for partition 0 before the first build;
        :meth:`built` calls it for the next partition.
        """
        if self._prefetcher is None:
            raise ValueError("this ReleasePlan was made without prefetch=...: pass one of "
                             "weightmap.PREFETCH_METHODS to from_names or from_tensors")
        if not 0 <= index < self.partitions:
            raise ValueError(f"cannot prefetch partition {index}: the plan has {self.partitions}")
        asked = 0
        last = min(self.partitions - 1, index + self.prefetch_ahead)
        for i in range(max(index, self._warmed + 1, self._next), last + 1):
            ranges = self._ranges[i]
            self._prefetcher.submit(ranges, tag=i)
            asked += sum(r.length for r in ranges)
        self._warmed = max(self._warmed, last)
        return asked

    def wait_for_prefetch(self, timeout: float | None = None) -> bool:
        """Block until everything asked for was asked of the kernel (True), or ``timeout`` seconds pass (False).

        A builder never needs this: builds read pages whether or not they are
        warm yet. It is for measuring prefetch. True at once without ``prefetch=``.
        """
        return self._prefetcher.wait(timeout) if self._prefetcher is not None else True

    @property
    def prefetch_stats(self) -> PrefetchStats | None:
        """What the prefetch thread did so far (None without ``prefetch=``)."""
        return self._prefetcher.stats if self._prefetcher is not None else None

    def close(self) -> None:
        """Stop the prefetch threads, if any (what was still to warm is dropped; queued evictions finish). Releasing
        is unaffected.

        :meth:`built` after ``close()`` still releases and drops what its partition
        read (with ``drop_cache``, evicting on the caller's thread), and warms nothing.
        The last :meth:`built` closes the thread too, and so does dropping the plan.
        """
        if self._prefetcher is not None:
            self._prefetcher.close()

    def __enter__(self) -> ReleasePlan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def last_use(self, tensor: torch.Tensor) -> int | None:
        """The index of the last partition that reads ``tensor`` (None if none does)."""
        key = _storage_key(tensor)
        weight = self._weights.get(key) if key else None
        return weight.last if weight else None

    @property
    def pending_bytes(self) -> int:
        """Bytes of the storages whose last reader is not built yet."""
        return sum(w.nbytes for w in self._weights.values() if w.last >= self._next)

    def built(self, index: int) -> ReleaseStep:
        """Partition ``index`` is built: release or drop what it read (see the class).

        Partitions must be reported in order, each once (0, 1, 2, ...): a
        ``ValueError`` otherwise, since releasing out of order could free a
        weight that an earlier partition still has to read.

        With ``prefetch=``, what is left of partition ``index``'s own prefetch
        is dropped, and after the release partitions up to
        ``index + 1 + prefetch_ahead`` are asked for (see :meth:`prefetch`).
        """
        if index != self._next:
            raise ValueError(f"partition {index} reported built, but partition {self._next} is next")
        if index >= self.partitions:
            raise ValueError(f"partition {index} reported built, but the plan has {self.partitions}")
        self._next += 1
        released = released_bytes = kept = kept_bytes = dropped = dropped_bytes = 0
        gone: list[torch.UntypedStorage] = []  # mapped storages no partition reads again
        for weight in self._by_partition[index]:
            storage = weight.storage
            assert storage is not None, "a weight was let go before its last reader"
            if weight.last == index:
                weight.storage = None
                if release_storage(storage, resize=self.resize):
                    released, released_bytes = released + 1, released_bytes + weight.nbytes
                    if weight.mapped:
                        gone.append(storage)
                else:
                    kept, kept_bytes = kept + 1, kept_bytes + weight.nbytes
            elif self.reread and weight.mapped and release_mapped_storage(storage):
                dropped, dropped_bytes = dropped + 1, dropped_bytes + weight.nbytes
        last = index + 1 == self.partitions
        warming = self._prefetcher is not None and not self._prefetcher.closed
        if self.drop_cache and gone:
            ranges = file_ranges(gone, merge_gap=0)  # never a gap: it may hold a weight still to be read
            if self._prefetcher is not None and warming and not last:
                self._prefetcher.evict(ranges)
            else:
                try:
                    evict_ranges(ranges)
                except OSError as exc:  # the file is gone or replaced: nothing of ours is cached
                    log.debug("dropping partition %d's pages from the page cache stopped: %s", index, exc)
        if self._prefetcher is not None:
            self._prefetcher.cancel_through(index)
            if warming and not last:
                self.prefetch(index + 1)
            else:
                self._prefetcher.shutdown()  # nothing is left to warm, or close() stopped warming
        return ReleaseStep(index, released, released_bytes, kept, kept_bytes, dropped, dropped_bytes)
