"""``make bench-map``: what mapping costs next to the usual lazy loaders.

Writes a synthetic checkpoint (about 800 tensors and 2 GiB by default) as
safetensors and as a ``torch.save`` file, then times, in one run and over
several repetitions each, putting it into a model built on the meta device:

* ``map_weights``                                   (this library)
* ``safetensors.torch.load_file`` + ``load_state_dict(assign=True)``
* ``torch.load(mmap=True)`` + ``load_state_dict(assign=True)``

and prints the medians, the ratios to ``load_file`` + assign, and the RSS
growth each leaves behind. The cost of ``map_weights`` should grow with the
number of tensors, not their bytes: it reads nothing but the header.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.fileio.atomic import atomic_file
from harness.measure.procfs import read_status
from harness.units import GIB, MIB, format_gib
from weightmap import TensorSpec, map_weights, write_checkpoint

WIDTH = 1024


class Stack(torch.nn.Module):
    """``count`` float32 matrices of ``rows`` x 1024, named like a layer stack."""

    def __init__(self, count: int, rows: int) -> None:
        super().__init__()
        self.layers = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.empty(rows, WIDTH)) for _ in range(count)]
        )


@dataclass(frozen=True)
class Result:
    """One loader's timings and the RSS it left behind."""

    name: str
    times_s: list[float]
    rss_growth_bytes: list[int]

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def rss_growth_median(self) -> int:
        return int(statistics.median(self.rss_growth_bytes))


def make_checkpoints(folder: Path, count: int, total_bytes: int) -> tuple[Path, Path, int]:
    """The safetensors and torch.save files of a Stack (reused when present); returns rows too."""
    rows = max(1, total_bytes // (count * WIDTH * 4))
    st = folder / f"bench-{count}x{rows}.safetensors"
    pt = folder / f"bench-{count}x{rows}.pt"
    folder.mkdir(parents=True, exist_ok=True)
    if not st.exists():
        specs = [TensorSpec(f"layers.{i}", torch.float32, (rows, WIDTH)) for i in range(count)]
        write_checkpoint(st, specs, lambda spec: torch.ones(spec.shape))
    if not pt.exists():
        from safetensors.torch import load_file

        with atomic_file(pt) as handle:  # a conversion cut short is never taken for a finished one
            torch.save(load_file(str(st)), handle)
    return st, pt, rows


def _map(model: torch.nn.Module, st: Path, pt: Path) -> object:
    return map_weights(model, st, strict=True)


def _load_file(model: torch.nn.Module, st: Path, pt: Path) -> object:
    from safetensors.torch import load_file

    return model.load_state_dict(load_file(str(st)), assign=True)


def _torch_load(model: torch.nn.Module, st: Path, pt: Path) -> object:
    return model.load_state_dict(torch.load(pt, mmap=True, weights_only=True), assign=True)


LOADERS: dict[str, Callable[[torch.nn.Module, Path, Path], object]] = {
    "map_weights": _map,
    "load_file + assign": _load_file,
    "torch.load(mmap) + assign": _torch_load,
}


def measure(name: str, loader: Callable[[torch.nn.Module, Path, Path], object], st: Path, pt: Path,
            count: int, rows: int, repeat: int) -> Result:
    """Time ``repeat`` runs of one loader, each onto a fresh meta model."""
    times, growth = [], []
    for _ in range(repeat):
        with torch.device("meta"):
            model = Stack(count, rows)
        gc.collect()
        before = read_status().rss_bytes
        start = time.perf_counter()
        keep = loader(model, st, pt)
        times.append(time.perf_counter() - start)
        growth.append(read_status().rss_bytes - before)
        del keep, model
        gc.collect()
    return Result(name, times, growth)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.bench_map", description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=800)
    parser.add_argument("--gib", type=float, default=2.0, help="checkpoint size in GiB (default 2)")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--dir", type=Path, default=Path("data") / "bench")
    args = parser.parse_args(argv)
    st, pt, rows = make_checkpoints(args.dir, args.tensors, int(args.gib * GIB))
    print(f"checkpoint: {args.tensors} tensors of {rows}x{WIDTH} float32, "
          f"{format_gib(st.stat().st_size)}; {args.repeat} repetitions each", file=sys.stderr)
    results = [measure(n, f, st, pt, args.tensors, rows, args.repeat) for n, f in LOADERS.items()]
    peer = next(r for r in results if r.name == "load_file + assign")
    print(f"{'loader':<28} {'median':>10} {'vs load_file':>13} {'RSS growth':>12}")
    for r in results:
        print(f"{r.name:<28} {r.median_s * 1e3:>8.2f}ms {r.median_s / peer.median_s:>12.2f}x "
              f"{r.rss_growth_median / MIB:>9.2f}MiB")
    ours = results[0]
    ok_speed = ours.median_s <= 1.5 * peer.median_s
    ok_rss = ours.rss_growth_median <= 16 * MIB
    print(f"goal: map_weights within 1.5x of load_file + assign: {'met' if ok_speed else 'NOT met'}; "
          f"RSS after mapping within 16 MiB of before: {'met' if ok_rss else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
