"""GPU memory readers: device-wide usage from NVML, and torch's caching-allocator reservation.

NVML (``pynvml``, from the ``nvidia-ml-py`` package) is optional: without it, or without an
NVIDIA driver or device, :meth:`GpuMonitor.open` returns None and the harness records no GPU
figures. NVML's ``used`` is device-wide (every process, plus what the driver reserves once a
context exists), so callers subtract a baseline taken after the CUDA context exists.

Device numbering: ``device_index`` is a CUDA index, as torch numbers devices. NVML ignores
``CUDA_VISIBLE_DEVICES``, so :meth:`GpuMonitor.open` applies it: a numeric entry is taken as
an NVML index (CUDA orders devices fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``;
on machines with identical GPUs both orders agree), a ``GPU-``/``MIG-`` entry is matched
against NVML UUIDs (a unique prefix is enough, as for CUDA).
"""

from __future__ import annotations

import os
import sys
from types import ModuleType, TracebackType
from typing import Any

try:
    import pynvml as _pynvml
except ImportError:  # nvidia-ml-py is optional
    _pynvml = None

pynvml: ModuleType | None = _pynvml


def _visible_entry(device_index: int) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` entry for a CUDA index; ``str(device_index)`` when unset,
    None when the index is not visible. CUDA stops at the first invalid entry."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return str(device_index)
    entries: list[str] = []
    for token in raw.split(","):
        token = token.strip()
        if not token or not (token.isdigit() or token.startswith(("GPU-", "MIG-"))):
            break
        entries.append(token)
    return entries[device_index] if 0 <= device_index < len(entries) else None


def _nvml_handle(nvml: Any, entry: str) -> Any:
    """NVML handle for a ``CUDA_VISIBLE_DEVICES``-style entry; None if no device matches."""
    if entry.isdigit():
        index = int(entry)
        return nvml.nvmlDeviceGetHandleByIndex(index) if index < nvml.nvmlDeviceGetCount() else None
    try:
        return nvml.nvmlDeviceGetHandleByUUID(entry)
    except nvml.NVMLError:
        pass
    matches = []
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        uuid = nvml.nvmlDeviceGetUUID(handle)
        if (uuid.decode() if isinstance(uuid, bytes) else uuid).startswith(entry):
            matches.append(handle)
    return matches[0] if len(matches) == 1 else None


class GpuMonitor:
    """Memory of one NVIDIA device, read through NVML.

    Create it with :meth:`open`. ``name`` and ``total_bytes`` are read once;
    :meth:`used_bytes` is one NVML query (microseconds). Methods may be called from
    any thread. Call :meth:`close` (or use it as a context manager) to release NVML.
    """

    def __init__(self, handle: Any, *, device_index: int, name: str, total_bytes: int) -> None:
        """Wrap an NVML device handle; use :meth:`open` rather than calling this directly."""
        self._handle = handle
        self.device_index = device_index
        self.name = name
        self.total_bytes = total_bytes
        self._open = handle is not None

    @classmethod
    def open(cls, device_index: int = 0) -> GpuMonitor | None:
        """Monitor for CUDA device ``device_index``; None when ``pynvml`` is missing, NVML
        cannot start (no driver) or there is no such device. Never raises for those."""
        nvml = pynvml
        if nvml is None:
            return None
        entry = _visible_entry(device_index)
        if entry is None:
            return None
        try:
            nvml.nvmlInit()
        except (nvml.NVMLError, OSError):
            return None
        try:
            handle = _nvml_handle(nvml, entry)
            if handle is None:
                nvml.nvmlShutdown()
                return None
            raw_name = nvml.nvmlDeviceGetName(handle)
            name = raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name)
            total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
        except nvml.NVMLError:
            nvml.nvmlShutdown()
            return None
        return cls(handle, device_index=device_index, name=name, total_bytes=total)

    def used_bytes(self) -> int:
        """Device-wide memory in use, in bytes (NVML ``used``: all processes and the driver)."""
        if not self._open or pynvml is None:
            raise ValueError("GpuMonitor used after close()")
        return int(pynvml.nvmlDeviceGetMemoryInfo(self._handle).used)

    def close(self) -> None:
        """Release NVML (each :meth:`open` starts it once). Idempotent."""
        if self._open:
            self._open = False
            if pynvml is not None:
                pynvml.nvmlShutdown()

    def __enter__(self) -> GpuMonitor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def torch_reserved_bytes(device: int | None = None) -> int | None:
    """``torch.cuda.memory_reserved(device)`` once CUDA is initialised in this process, else None.

    Never imports torch and never initialises CUDA: before the process's first CUDA call the
    caching allocator has reserved nothing anyway. ``device=None`` means the calling thread's
    current device, which in a new thread is device 0 whatever the main thread chose: a
    sampling thread should pass the index explicitly. Cheap enough for a sampling loop (microseconds).
    """
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is None or not cuda.is_initialized():
        return None
    return int(cuda.memory_reserved(device))
