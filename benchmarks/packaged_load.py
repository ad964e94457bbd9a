"""What loading a packaged engine costs: time, anonymous memory and disk, in a fresh process.

Builds one engine of a ``--mib`` MiB linear layer with each packaging (``packaged``: the harness
streams the weights into the artifact as an external blob; ``packaged_compiler``: AOTInductor
serializes them into the engine's shared library), then loads each artifact with
``torch._inductor.aoti_load_package`` in a fresh process, ``--loads`` times (each load a new
process, the artifact dropped from the page cache before it when ``--cold``). Per setting it prints the
median load time with its range, the load time against the artifact's size at 1 GB/s, the
process's anonymous memory added by the load (``RssAnon`` after − before) as a multiple of the
weight, and the largest size of the loader's temporary directory (where torch's loader extracts
the archive), sampled while it loads.

    python benchmarks/packaged_load.py --mib 256 --loads 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import torch

from harness.engines.compile.inductor import InductorCompiler
from harness.measure.coldcache import write_back_and_drop

MIB = 2**20

_LOAD = """
import json, os, sys, threading, time, glob
import torch

def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0

def tree(root):
    total = 0
    for folder, _, files in os.walk(root):
        for f in files:
            try:
                total += os.lstat(os.path.join(folder, f)).st_size
            except OSError:
                pass
    return total

tmp = sys.argv[2]
os.environ["TMPDIR"] = tmp
import tempfile; tempfile.tempdir = tmp
peak, done = [0], [False]
def watch():
    while not done[0]:
        peak[0] = max(peak[0], tree(tmp))
        time.sleep(0.005)
threading.Thread(target=watch, daemon=True).start()
x = torch.randn(4, int(sys.argv[3]))
before = anon()
start = time.perf_counter()
engine = torch._inductor.aoti_load_package(sys.argv[1])
seconds = time.perf_counter() - start
after = anon()
engine(x)
done[0] = True
print(json.dumps({"load_s": seconds, "anon_added": after - before, "tmp_peak": peak[0]}))
"""


class _Layer(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=256, help="the weight's size in MiB")
    parser.add_argument("--loads", type=int, default=5, help="fresh-process loads per setting")
    parser.add_argument("--cold", action="store_true", help="drop the artifact from the page cache before each load")
    args = parser.parse_args(argv)
    width = int((args.mib * MIB / 4) ** 0.5)
    weight = width * width * 4
    with tempfile.TemporaryDirectory() as work:
        layer = _Layer(width).eval()
        program = torch.export.export(layer, (torch.randn(4, width),))
        for setting in ("packaged", "packaged_compiler"):
            compiler = InductorCompiler(weights=setting)  # type: ignore[arg-type]
            with compiler.session(Path(work) / "cache"):
                artifact = compiler.compile(program, Path(work) / setting).path
            size = artifact.stat().st_size
            runs = []
            for _ in range(args.loads):
                if args.cold:
                    write_back_and_drop(artifact)
                with tempfile.TemporaryDirectory(dir=work) as tmp:
                    out = subprocess.run([sys.executable, "-c", textwrap.dedent(_LOAD), str(artifact), tmp, str(width)],
                                         check=True, capture_output=True, text=True)
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            times = [r["load_s"] for r in runs]
            print(f"{setting}: artifact {size / MIB:.1f} MiB, weight {weight / MIB:.1f} MiB; load "
                  f"{statistics.median(times):.3f} s median ({min(times):.3f}-{max(times):.3f}) over {len(runs)} "
                  f"fresh processes = {statistics.median(times) / (size / 1e9):.2f} x size/(1 GB/s); anonymous "
                  f"memory added {statistics.median(r['anon_added'] for r in runs) / weight:.2f} x the weight; "
                  f"loader's temporary directory up to {max(r['tmp_peak'] for r in runs) / MIB:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
