"""Models and /proc readers shared by the weightmap tests."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch import nn


class TinyNet(nn.Module):
    """A small model with what real ones have: a tied embedding, buffers of both kinds."""

    def __init__(self, vocab: int = 64, width: int = 32, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width, dtype=dtype)
        self.blocks = nn.ModuleList([nn.Linear(width, width, dtype=dtype) for _ in range(3)])
        self.norm = nn.LayerNorm(width, dtype=dtype)
        self.head = nn.Linear(width, vocab, bias=False, dtype=dtype)
        self.head.weight = self.embed.weight  # tied
        self.register_buffer("scale", torch.ones(width, dtype=dtype))
        self.register_buffer("inv_freq", torch.arange(width, dtype=dtype) / width, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) * self.scale + self.inv_freq
        for block in self.blocks:
            x = x + torch.tanh(block(x))
        return self.head(self.norm(x))

    def partitions(self) -> list[list[str]]:
        """Names each engine reads, in build order (the tied weight in the first and the last)."""
        return [
            ["embed.weight", "scale"],
            ["blocks.0.weight", "blocks.0.bias", "blocks.1.weight", "blocks.1.bias"],
            ["blocks.2.weight", "blocks.2.bias", "norm.weight", "norm.bias"],
            ["head.weight"],
        ]


def seeded(model: nn.Module, seed: int = 0) -> nn.Module:
    """Fill every parameter and persistent buffer with seeded values."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in model.state_dict(keep_vars=True).values():
            t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype))
    return model


def meta_tiny(**kwargs: object) -> TinyNet:
    with torch.device("meta"):
        return TinyNet(**kwargs)  # type: ignore[arg-type]


def mapped_ranges(path: str | os.PathLike[str]) -> list[tuple[int, int]]:
    """Address ranges that /proc/self/maps shows for ``path``."""
    target = os.path.realpath(path)
    ranges = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].strip() == target:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                ranges.append((lo, hi))
    return ranges


def inside(tensor: torch.Tensor, ranges: list[tuple[int, int]]) -> bool:
    """True when the tensor's bytes lie inside one of the ranges."""
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    return any(lo <= start and end <= hi for lo, hi in ranges)


def smaps_rss(path: str | os.PathLike[str]) -> int:
    """Resident bytes of this process's mappings of ``path`` (from /proc/self/smaps)."""
    target = os.path.realpath(path)
    total, current = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            first = line.split(maxsplit=5)
            if first and "-" in first[0] and len(first) >= 5 and not first[0].endswith(":"):
                current = len(first) == 6 and first[5].strip() == target
            elif current and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
    return total


def sha256(path: str | os.PathLike[str]) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def snapshot(model: nn.Module) -> dict[str, tuple[int, torch.device, torch.dtype]]:
    """Identity, device and dtype of every tensor: what "left unchanged" means."""
    named = list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False))
    return {name: (id(t), t.device, t.dtype) for name, t in named}


def returned_or_raised(call: Callable[[], object], fifo: Path, what: str, seconds: float = 10) -> object:
    """What ``call()`` returned or raised, run on a thread.

    A call still blocked after ``seconds`` fails the test (``what`` names it), once ``fifo``
    was opened for writing without blocking, so that a reader stuck opening it goes on and
    the thread ends.
    """
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # noqa: B036 - handed to the test thread
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        with contextlib.suppress(OSError):  # ENXIO: nobody is reading it (any more)
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(seconds)
        pytest.fail(f"{what} blocked on the named pipe {fifo}")
    return outcome[0]


@contextlib.contextmanager
def tmpfs(where: Path, options: str) -> Iterator[Path]:
    """A small tmpfs mounted at ``where``; skips the test where mounting is not allowed."""
    where.mkdir()
    if not sys.platform.startswith("linux") or shutil.which("mount") is None:
        pytest.skip("needs Linux's mount")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
