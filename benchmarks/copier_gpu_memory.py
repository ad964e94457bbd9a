"""Where does the GPU memory that the copy builder's staged copy adds come from?

NVML's used bytes of device 0, read after each step a :class:`harness.engines.copy.CopyToDevice` takes
on a CUDA device, each step's growth printed: CUDA's context, one engine buffer, the pinned ring's two
host buffers (:class:`harness.engines.pinned.PinnedRing`), a non-blocking copy from a thread's default
stream, torch's first ``torch.cuda.Stream()`` (which creates the device's pool of streams), a copy on
that stream, and a second ``torch.cuda.Stream()``. ``results/pi05-h200`` measured every strategy's GPU
peak above the engines' sum by more than one buffer per engine rounds up to; a step here whose growth
matches the gap names its cause.

    python benchmarks/copier_gpu_memory.py

It needs a CUDA device and nvidia-ml-py.
"""

from __future__ import annotations

import threading

import pynvml
import torch

from harness.engines.staging import CHUNK_BYTES, SLOTS
from harness.units import MIB


class Used:
    """NVML's used bytes of device 0, each reading printed with its growth since the last."""

    def __init__(self) -> None:
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.last = 0

    def read(self, step: str) -> None:
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
        used = int(pynvml.nvmlDeviceGetMemoryInfo(self.handle).used)
        print(f"{step:60s} used {used / MIB:9.1f} MiB, grew {(used - self.last) / MIB:8.1f} MiB", flush=True)
        self.last = used


def main() -> int:
    if not torch.cuda.is_available():
        print("copier_gpu_memory: needs a CUDA device; none is visible to torch")
        return 1
    used = Used()
    used.read("before CUDA is initialised")
    torch.empty(1, device="cuda")
    used.read("CUDA initialised (one element allocated)")
    engine = torch.empty(4 * CHUNK_BYTES, dtype=torch.uint8, device="cuda")
    used.read(f"one engine buffer of {4 * CHUNK_BYTES // MIB} MiB")
    ring = [torch.ones(CHUNK_BYTES, dtype=torch.uint8, pin_memory=True) for _ in range(SLOTS)]
    used.read(f"the pinned ring: {SLOTS} host buffers of {CHUNK_BYTES // MIB} MiB")

    def copy_on_default_stream() -> None:
        engine[:CHUNK_BYTES].copy_(ring[0], non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        event.synchronize()

    thread = threading.Thread(target=copy_on_default_stream)
    thread.start()
    thread.join()
    used.read("a non-blocking copy on a thread's default stream")
    stream = torch.cuda.Stream()
    used.read("the first torch.cuda.Stream() (the stream pool)")
    with torch.cuda.stream(stream):
        engine[CHUNK_BYTES: 2 * CHUNK_BYTES].copy_(ring[1], non_blocking=True)
    stream.synchronize()
    used.read("a non-blocking copy on that stream")
    torch.cuda.Stream()
    used.read("a second torch.cuda.Stream()")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
