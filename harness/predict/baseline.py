"""The process baseline on this machine: a fresh Python with torch imported, as each strategy's worker starts.

:func:`measure_baseline` runs one such interpreter and reads its ``/proc/self/status`` (RSS and its anonymous part,
:func:`harness.measure.procfs.read_status`); for a GPU device it first makes the CUDA context there (one allocation)
and reports what NVML saw the device's used memory grow by, where NVML can be read. A run's own baseline is a little
larger (the harness and the model on meta): results/pi05 recorded 0.226 GiB where this measures about 0.2.
"""

from __future__ import annotations

import json
import subprocess
import sys

from harness.catalog import is_gpu
from harness.errors import HarnessError
from harness.predict.inputs import Baseline

__all__ = ["measure_baseline"]

_PROGRAM = r"""
import json, sys
import torch
from harness.measure.procfs import read_status
device = sys.argv[1]
context = None
if device.startswith("cuda"):
    used = None
    try:
        import pynvml
        pynvml.nvmlInit()
        index = torch.device(device).index or 0
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        used = pynvml.nvmlDeviceGetMemoryInfo(handle).used
    except Exception:
        pass
    torch.zeros(1, device=device)
    torch.cuda.synchronize(device)
    if used is not None:
        context = pynvml.nvmlDeviceGetMemoryInfo(handle).used - used - torch.cuda.memory_reserved(device)
status = read_status()
print(json.dumps({"rss": status.rss_bytes, "anon": status.anon_bytes, "context": context}))
"""


def measure_baseline(device: str) -> Baseline:
    """Measure the baseline of a fresh interpreter with torch imported (and a CUDA context on a GPU ``device``)."""
    done = subprocess.run([sys.executable, "-c", _PROGRAM, device], capture_output=True, text=True, timeout=300,
                          check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise HarnessError(f"cannot measure the baseline on {device}: {last}; pass --baseline-gib")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return Baseline(figures["rss"], figures["anon"], figures["context"] if is_gpu(device) else None)
