"""Where and with what a result was made: machine, versions, commit."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import psutil

from harness.backends import backend_packages


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _first_version(distributions: tuple[str, ...]) -> str | None:
    """The version of the first of ``distributions`` installed; None where none is."""
    return next((v for v in map(_version, distributions) if v is not None), None)


def versions() -> dict[str, str | None]:
    """Versions of everything that shapes the figures, every backend's optional packages among them
    (:func:`harness.backends.backend_packages`); None for what is not installed."""
    import torch

    import weightmap

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "safetensors": _version("safetensors"),
        **{p.key: _first_version(p.distributions) for p in backend_packages()},
        "lerobot": _version("lerobot"),
        "weightmap": weightmap.__version__,
    }


def gpu_name() -> str | None:
    """The first CUDA device's name, or None without one (does not initialise CUDA)."""
    from harness.measure.gpu import GpuMonitor

    monitor = GpuMonitor.open(0)
    if monitor is None:
        return None
    try:
        return monitor.name
    finally:
        monitor.close()


def machine() -> dict[str, Any]:
    """CPU count, memory, GPU, kernel and host name of this machine."""
    return {
        "cpus": os.cpu_count(),
        "mem_total_bytes": psutil.virtual_memory().total,
        "gpu": gpu_name(),
        "kernel": platform.release(),
        "hostname": platform.node(),
        "platform": platform.platform(),
    }


def commit(root: Path = Path(".")) -> str | None:
    """The checked-out git commit (with ``-dirty`` when the tree has changes), or None outside git.

    A copy of the tree without its ``.git`` (a remote machine, say) can name its commit in the
    ``HARNESS_COMMIT`` environment variable.
    """
    if os.environ.get("HARNESS_COMMIT"):
        return os.environ["HARNESS_COMMIT"]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             check=True, timeout=10).stdout.strip()
        # results/ is tracked and rewritten by every run: it does not make the code dirty
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)results"], cwd=root,
                               capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{sha}-dirty" if dirty else sha
