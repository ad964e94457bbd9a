"""Does dropping a loaded AOTInductor engine give its memory back?

Builds one engine of a single ``--mib`` MiB linear layer with each weight
setting (``packaged``: the artifact holds the weight; ``mapped``: it runs on a
tensor it is handed), then loads it, runs it once and drops it ``--loads``
times, collecting garbage after each. Per setting it prints the process's RSS
growth over those loads, the growth per load as a multiple of the weight, how
many mappings of the engine's shared library the process still holds, and how
many references to the handed weight outlive every engine (``mapped``; 0 if
dropping an engine let go of it).

    python benchmarks/engine_unload.py --mib 64 --loads 6
    python benchmarks/engine_unload.py --device cuda

One process per run: what the first setting leaves behind is counted in the
process's RSS for the second, so compare the growth over the loads, not the
totals.
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
import tempfile
from pathlib import Path

import psutil
import torch

from harness.engines.compile.inductor import WEIGHTS, InductorCompiler

MIB = 2**20


class _Layer(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.proj(x).relu(),)


def _library_mappings(stem: str) -> int:
    """Mappings in this process of the shared libraries extracted from packages named ``stem``."""
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if f"/{stem}/" in line and ".so" in line)


def measure(weights: str, width: int, loads: int, device: str, work: Path) -> dict[str, float]:
    """Build, then load/run/drop ``loads`` times; returns the figures the table prints."""
    compiler = InductorCompiler(weights=weights, device=device)  # type: ignore[arg-type]
    x = torch.randn(4, width)
    with compiler.session(work / "cache"):
        program = torch.export.export(_Layer(width), (x,))
        artifact = compiler.compile(program, work / f"engine-{weights}")
        del program
        gc.collect()
        handed = next(iter(artifact.constants.values()), None)
        held_before = None if handed is None else sys.getrefcount(handed)
        x = x.to(compiler.device)
        rss0 = psutil.Process().memory_info().rss
        for _ in range(loads):
            engine = compiler.load(artifact)
            engine(x)
            del engine
            gc.collect()
        grown = psutil.Process().memory_info().rss - rss0
        kept = None if handed is None or held_before is None else sys.getrefcount(handed) - held_before
    weight = width * width * 4
    return {
        "rss_growth_mib": grown / MIB,
        "per_load_x_weight": grown / loads / weight,
        "library_mappings": _library_mappings(f"engine-{weights}"),
        "references_kept": math.nan if kept is None else kept,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=64.0, help="the engine's weight, MiB (default 64)")
    parser.add_argument("--loads", type=int, default=6, help="load/run/drop cycles (default 6)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    args = parser.parse_args(argv)
    if args.loads < 1 or args.mib <= 0:
        parser.error("--loads must be at least 1 and --mib positive")
    width = max(8, int(math.sqrt(args.mib * MIB / 4)))
    print(f"torch {torch.__version__}, {args.device}, one {width}x{width} float32 layer "
          f"({width * width * 4 / MIB:.0f} MiB), {args.loads} loads")
    print(f"{'weights':<9} {'RSS growth':>11} {'per load':>13} {'library mappings':>17} {'references kept':>16}")
    with tempfile.TemporaryDirectory() as tmp:
        for weights in WEIGHTS:
            row = measure(weights, width, args.loads, args.device, Path(tmp))
            kept = "-" if math.isnan(row["references_kept"]) else f"{row['references_kept']:.0f}"
            print(f"{weights:<9} {row['rss_growth_mib']:>7.0f} MiB {row['per_load_x_weight']:>9.2f} x w "
                  f"{row['library_mappings']:>17.0f} {kept:>16}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
