"""The CUDA side of a staged copy (:mod:`harness.engines.staging`): a ring of pinned host buffers, a side stream
and an event per buffer.

A chunk is copied by ``memcpy`` from the (file-backed) source into a pinned buffer, then by an asynchronous
host-to-device copy of that buffer on the ring's own stream; the buffer's event, recorded after that copy, is
waited for before the buffer is filled again. Pinned memory is host memory: the ring's
``slots * chunk_bytes`` (32 MiB by default) count in the host's figures as long as the builder lives.
"""

from __future__ import annotations

import torch

from harness.engines.staging import CHUNK_BYTES, SLOTS

__all__ = ["PinnedRing"]


class PinnedRing:
    """A :class:`~harness.engines.staging.Stager` into CUDA device ``device`` (see the module docstring).

    Made on any thread; its copies are started from the copier's thread, on :attr:`stream`.
    """

    def __init__(self, device: str | torch.device = "cuda", slots: int = SLOTS, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.device = torch.device(device)
        self.slots, self.chunk_bytes = slots, chunk_bytes
        self.stream = torch.cuda.Stream(self.device)
        self._buffers = [torch.empty(chunk_bytes, dtype=torch.uint8, pin_memory=True) for _ in range(slots)]
        self._events: list[torch.cuda.Event | None] = [None] * slots

    def wait(self, slot: int) -> None:
        event = self._events[slot]
        if event is not None:
            event.synchronize()

    def copy(self, slot: int, source: torch.Tensor, destination: torch.Tensor) -> None:
        staged = self._buffers[slot][: source.numel()]
        staged.copy_(source)  # the host's memcpy: reads the source's pages
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            destination.copy_(staged, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        self._events[slot] = event

    def drain(self) -> None:
        self.stream.synchronize()

    def close(self) -> None:
        self.drain()
        self._events = [None] * self.slots
        self._buffers.clear()
