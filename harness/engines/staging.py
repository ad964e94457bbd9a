"""Copying engines to the device on a thread of their own, through a small ring of staging buffers.

A build on a GPU spends its time in two ways: waiting for its partition's pages, and copying them
to the device. :class:`Copier` lets engine ``k``'s copy run while engine ``k + 1``'s pages come in:
the building thread hands it engine ``k``'s ``(source, destination)`` byte pairs and goes on; a
thread of the copier's own copies them chunk by chunk, each chunk through one buffer of a
:class:`Stager`'s ring (on a GPU, :class:`harness.engines.pinned.PinnedRing`: a ``memcpy`` into a
pinned host buffer, then an asynchronous copy of it on a side stream).

The contract, which the builder and the worker build on:

* **one engine in flight**: :meth:`Copier.submit` refuses a second engine while one is copying;
  the building thread takes the finished one first (:meth:`Copier.poll`, :meth:`Copier.wait`);
* **done means done**: an engine is reported finished only once every chunk of it was copied and
  the stager drained (:meth:`Stager.drain`: nothing of it is still read from the host or written
  to the device), and the copier holds no reference to its sources any more; only then may its pages
  be released (a storage another tensor still views is not resized, a mapping still viewed stays);
* **errors surface**: an error on the copier's thread is raised, naming the engine and the tensor,
  by the next :meth:`Copier.poll` or :meth:`Copier.wait` on the building thread;
* **nothing left running**: :meth:`Copier.close` stops the copy in flight between two chunks, drains
  the stager and joins the thread; it is idempotent.

The stager is injected, so the ordering is tested on the CPU (:class:`HostRing` copies through
ordinary host buffers); the CUDA specifics are all in :mod:`harness.engines.pinned`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from harness.units import MIB

__all__ = ["CHUNK_BYTES", "SLOTS", "Copier", "CopyFailed", "HostRing", "Stager", "StagedPair"]

SLOTS = 2
"""Staging buffers in a ring: one filled by the host while the other is copied to the device."""
CHUNK_BYTES = 16 * MIB
"""Bytes of one staging buffer (the ring holds :data:`SLOTS` of them: 32 MiB of host memory)."""


class Stager(Protocol):
    """Copies chunks to their destination through a ring of ``slots`` buffers of ``chunk_bytes`` each."""

    @property
    def slots(self) -> int: ...

    @property
    def chunk_bytes(self) -> int: ...

    def wait(self, slot: int) -> None:
        """Block until buffer ``slot``'s last copy is finished, so that it may be filled again."""

    def copy(self, slot: int, source: torch.Tensor, destination: torch.Tensor) -> None:
        """Copy ``source`` (at most ``chunk_bytes`` of ``uint8``, on the host) into buffer ``slot`` and start its
        copy into ``destination`` (as many ``uint8``); may return before ``destination`` holds it."""

    def drain(self) -> None:
        """Block until every copy started is finished."""

    def close(self) -> None:
        """Drain, then free the buffers."""


@dataclass
class HostRing:
    """A :class:`Stager` of ordinary host buffers whose copies finish as they are made: the CPU's stand-in for
    :class:`harness.engines.pinned.PinnedRing`."""

    slots: int = SLOTS
    chunk_bytes: int = CHUNK_BYTES

    def __post_init__(self) -> None:
        self._buffers = [torch.empty(self.chunk_bytes, dtype=torch.uint8) for _ in range(self.slots)]

    def wait(self, slot: int) -> None:
        return None

    def copy(self, slot: int, source: torch.Tensor, destination: torch.Tensor) -> None:
        staged = self._buffers[slot][: source.numel()]
        staged.copy_(source)
        destination.copy_(staged)

    def drain(self) -> None:
        return None

    def close(self) -> None:
        self._buffers.clear()


@dataclass(frozen=True)
class StagedPair:
    """One tensor of an engine to copy: its ``name``, its bytes on the host (``source``, flat ``uint8``) and where
    they go (``destination``, as many ``uint8``)."""

    name: str
    source: torch.Tensor
    destination: torch.Tensor


class CopyFailed(RuntimeError):
    """A staged copy failed on the copier's thread; raised on the building thread, from the original error."""


class Copier:
    """Copies one engine at a time on a thread of its own through ``stager`` (see the module docstring).

    ``device`` names the destination in errors. The thread starts with the first :meth:`submit`.
    """

    def __init__(self, stager: Stager, device: str) -> None:
        self.stager, self.device = stager, device
        self._cond = threading.Condition()
        self._job: Sequence[StagedPair] | None = None  # submitted, not yet taken by the thread
        self._busy: int | None = None  # the engine submitted and not yet taken back by poll/wait
        self._finished = False  # the engine in _busy is copied (or failed)
        self._error: BaseException | None = None
        self._stop = False
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (the copy in flight stops at its next chunk)."""
        return self._closed

    @property
    def in_flight(self) -> int | None:
        """The engine submitted and not yet taken back by :meth:`poll` or :meth:`wait` (None: none)."""
        return self._busy

    def submit(self, index: int, pairs: Sequence[StagedPair]) -> None:
        """Start copying engine ``index``'s ``pairs``; returns at once. ``RuntimeError`` while another engine is
        in flight (take it back first) or after :meth:`close`."""
        with self._cond:
            if self._closed:
                raise RuntimeError(f"engine {index}: the copier to {self.device} is closed")
            if self._busy is not None:
                raise RuntimeError(f"engine {index} submitted while engine {self._busy} is still in flight: "
                                   "one engine at a time")
            self._job, self._busy, self._finished, self._error = pairs, index, False, None
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="engine-copier", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def poll(self) -> int | None:
        """The engine in flight if its copy is finished (it is then no longer in flight), else None; raises
        :class:`CopyFailed` where its copy failed."""
        with self._cond:
            return self._take() if self._busy is not None and self._finished else None

    def copied(self, timeout: float | None = None) -> bool:
        """Block until the engine in flight is copied (or failed), without taking it back; False where ``timeout``
        seconds passed first, True at once where none is in flight."""
        with self._cond:
            return self._busy is None or self._cond.wait_for(lambda: self._finished, timeout)

    def wait(self) -> int | None:
        """Block until the engine in flight is copied and return it (None: none was in flight); raises
        :class:`CopyFailed` where its copy failed."""
        with self._cond:
            if self._busy is None:
                return None
            self._cond.wait_for(lambda: self._finished)
            return self._take()

    def _take(self) -> int:
        index, error = self._busy, self._error
        assert index is not None
        self._busy, self._finished, self._error = None, False, None
        if error is not None:
            raise CopyFailed(f"engine {index}: the staged copy to {self.device} failed: {error}") from error
        return index

    def close(self) -> None:
        """Stop the copy in flight (between two chunks), drain and close the stager, join the thread."""
        with self._cond:
            if self._closed:
                return
            self._closed = self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        try:
            self.stager.close()
        finally:
            self._thread = None

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._job is not None or self._stop)
                if self._job is None:
                    return
                pairs, self._job = self._job, None
            error: BaseException | None = None
            try:
                self._copy(pairs)
            except BaseException as exc:  # handed to the building thread by poll/wait
                error = exc
            # the engine's sources are let go of before it is reported copied: a view of a weight held here
            # would keep its storage from being resized and its file's pages mapped after the engine's release
            del pairs
            with self._cond:
                self._error, self._finished = error, True
                self._cond.notify_all()

    def _copy(self, pairs: Sequence[StagedPair]) -> None:
        stager, chunk, slots = self.stager, self.stager.chunk_bytes, self.stager.slots
        turn = 0
        try:
            for pair in pairs:
                try:
                    n = pair.source.numel()
                    if pair.destination.numel() != n:
                        raise ValueError(f"{n} source bytes for {pair.destination.numel()} destination bytes")
                    for start in range(0, n, chunk):
                        if self._stop:
                            raise RuntimeError("stopped: the copier was closed")
                        slot = turn % slots
                        turn += 1
                        stager.wait(slot)
                        end = min(n, start + chunk)
                        stager.copy(slot, pair.source[start:end], pair.destination[start:end])
                except Exception as exc:
                    raise RuntimeError(f"tensor {pair.name!r}: {exc}") from exc
        finally:
            stager.drain()  # done means done: nothing of this engine is still being read or written
